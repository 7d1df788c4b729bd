"""Validate goodput (tuning/goodput.py) by training to a target loss: do the paper's steps(B) (S_min (1 + B_noise / B)
and its step-by-step form along the run) predict the steps to the target and the fastest batch?

    nice python benchmarks/goodput_validate.py            # ~ a few minutes on 2 shared CPU cores
    python benchmarks/goodput_validate.py --tasks logreg  # one task

Three small CPU tasks, each a plain SGD loop:
  logreg  logistic regression on synthetic data (d=32, fresh samples every step);
  mlp     an MLP (2 -> 64 -> 64 -> 1, tanh) fitting the grey levels of matplotlib's bundled sample image
          grace_hopper.jpg (64 x 64 pixels) from their coordinates (mean-squared error);
  lm      a tiny causal transformer LM (one layer, width 32) on text from a random first-order Markov chain
          over 16 tokens (cross-entropy).
For each task: (1) a reference run (a middle batch, lr_max / 8) to the target reads, at every step, the
per-example gradient norms with the probe `gpuwise watch` uses (gpuwise/bootstrap/noise.py: B_simple) and, in a
second pass over the same path, the Hessian-weighted quantities of the paper's B_noise (HessianNoise: G'HG,
tr(H Sigma), H's top eigenvalue); (2) every batch size B trains from the same start to the target with the
learning rate tuned around `goodput.scaled_lr`'s (eq. 2.7 for SGD: lr_max / (1 + B_noise / B)), doubled while
the steps fall (up to lr_max), else halved; the fewest steps count (steps(B) assumes a tuned learning rate).
Steps to the target are those of the expected loss: the seeds' runs step in lockstep and the first evaluation
at which their mean loss is <= the target counts (`seeds_to_target`), not a single run's first dip below it;
(3) the prediction: `goodput.steps_to_target`: with one rate for the whole run (as the runs use, searched below
lr_max as theirs is), the run follows the reference's noise-free path (eq. 2.4-2.7 without the noise term, the
rate capped at 2 / lambda_max) down to the target minus the noise's settled excess at the target
(`goodput.noise_floor`: lr tr(Sigma) / (2B (2 - lr tr(H Sigma)/tr(Sigma)))), times the measured step time.
The reference run's readings go REF_PAST past the target for that, smoothed by centred means. Kept for
comparison: the one-step model summed along the path (`goodput.steps_along_path`), and eq. 2.11 with
single values of the noise scale (at the target, whole-run, progress-weighted mean) is kept for comparison.
`--replot` redraws the plot from the results file.

Writes benchmarks/results/goodput_validate.json and docs/goodput-validate.png.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from gpuwise.bootstrap.noise import ROW_KEYS, NoiseProbe  # noqa: E402
from gpuwise.monitoring.noise_scale import EMA_DECAY, noise_scale  # noqa: E402
from gpuwise.tuning import goodput  # noqa: E402
from gpuwise.tuning.reference import HessianNoise, follow, to_path  # noqa: E402

PATH_WINDOW = 0.1       # the path's readings: centred means over +-10 % of the run (one value for every task)
REF_PAST = 2.0          # the reference run's readings go on for twice its steps to the target again: far
                        # enough that no prediction is limited by the run's end (path_limited, checked below)
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


@dataclass
class Task:
    name: str
    model: object          # () -> nn.Module (same weights every call: seeded)
    batch: object          # (B, generator) -> batch
    loss: object           # (model, batch) -> scalar
    eval_loss: object      # (model) -> float on a fixed evaluation set
    target: float
    lr_max: float
    batch_sizes: list
    eval_every: int = 5
    max_steps: int = 20000
    min_seeds: int = 1     # at least this many runs per point, whatever --seeds says


# -- the tasks ------------------------------------------------------------------------------------------------

def logreg_task() -> Task:
    d = 32
    g = torch.Generator().manual_seed(1)
    w_star = torch.randn(d, generator=g) * (3.0 / math.sqrt(d))
    x_eval = torch.randn(16384, d, generator=g)
    y_eval = torch.bernoulli(torch.sigmoid(x_eval @ w_star), generator=g)
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    best = float(bce(x_eval @ w_star, y_eval))

    def model():
        m = torch.nn.Linear(d, 1)
        torch.nn.init.zeros_(m.weight)
        torch.nn.init.zeros_(m.bias)
        return m

    def batch(b, gen):
        x = torch.randn(b, d, generator=gen)
        return x, torch.bernoulli(torch.sigmoid(x @ w_star), generator=gen)

    def loss(m, bt):
        return bce(m(bt[0]).squeeze(1), bt[1])

    def eval_loss(m):
        with torch.no_grad():
            return float(bce(m(x_eval).squeeze(1), y_eval))

    return Task("logreg", model, batch, loss, eval_loss, target=best + 0.01, lr_max=4.0,
                batch_sizes=[16, 64, 256, 1024, 4096, 16384], eval_every=1,
                # B = 16 ends near its noise floor, where the mean loss of few runs crosses the target late or early
                # by chance: with 4 seeds its steps read 348 (seeds 0-3) and 264 (10-13), with 16 357 and 338 (0-15,
                # 20-35). The runs are cheap
                min_seeds=16)


def mlp_task() -> Task:
    import matplotlib.cbook
    import matplotlib.image

    with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as fh:
        img = torch.tensor(matplotlib.image.imread(fh, format="jpg"), dtype=torch.float32).mean(-1) / 255.0
    img = torch.nn.functional.interpolate(img[None, None], size=(64, 64), mode="area")[0, 0]
    ys, xs = torch.meshgrid(torch.linspace(-1, 1, 64), torch.linspace(-1, 1, 64), indexing="ij")
    coords = torch.stack([xs.reshape(-1), ys.reshape(-1)], 1)
    grey = (img.reshape(-1) - img.mean()) / img.std()
    n = len(grey)

    def model():
        torch.manual_seed(2)
        return torch.nn.Sequential(torch.nn.Linear(2, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                   torch.nn.Linear(64, 1))

    def batch(b, gen):
        i = torch.randint(0, n, (b,), generator=gen)
        return coords[i], grey[i]

    def loss(m, bt):
        return torch.nn.functional.mse_loss(m(bt[0]).squeeze(1), bt[1])

    def eval_loss(m):
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(m(coords).squeeze(1), grey))

    return Task("mlp", model, batch, loss, eval_loss, target=0.7, lr_max=0.25,
                batch_sizes=[16, 32, 64, 128, 256, 512, 1024])


def lm_task() -> Task:
    vocab, seq = 16, 32
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(vocab, vocab, generator=g) * 2.0
    trans = torch.softmax(logits, 1)
    stationary = torch.full((vocab,), 1.0 / vocab)
    for _ in range(200):
        stationary = stationary @ trans
    entropy = float(-(stationary[:, None] * trans * trans.log()).sum())

    def text(b, gen):
        out = torch.empty(b, seq + 1, dtype=torch.long)
        out[:, 0] = torch.multinomial(stationary, b, replacement=True, generator=gen)
        for t in range(seq):
            out[:, t + 1] = torch.multinomial(trans[out[:, t]], 1, generator=gen)[:, 0]
        return out

    eval_text = text(256, torch.Generator().manual_seed(4))
    mask = torch.nn.Transformer.generate_square_subsequent_mask(seq)

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, 32)
            self.pos = torch.nn.Parameter(torch.zeros(seq, 32))
            self.block = torch.nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
            self.head = torch.nn.Linear(32, vocab)

        def forward(self, tokens):
            h = self.emb(tokens) + self.pos
            return self.head(self.block(h, src_mask=mask, is_causal=True))

    def model():
        torch.manual_seed(5)
        return LM()

    def loss(m, bt):
        out = m(bt[:, :-1])
        return torch.nn.functional.cross_entropy(out.reshape(-1, vocab), bt[:, 1:].reshape(-1))

    def eval_loss(m):
        with torch.no_grad():
            return float(loss(m, eval_text))

    return Task("lm", model, text, loss, eval_loss, target=entropy + 0.02, lr_max=2.0,
                batch_sizes=[2, 4, 8, 16, 32, 64], eval_every=2, max_steps=6000)


TASKS = {"logreg": logreg_task, "mlp": mlp_task, "lm": lm_task}


# -- training to the target ------------------------------------------------------------------------------------

def train_to_target(task: Task, b: int, lr: float, seed: int, probe: NoiseProbe | None = None,
                    hessian: HessianNoise | None = None) -> dict:
    """Steps until the evaluation loss is <= the target (checked every `eval_every` steps), and the median
    time of a training step (evaluation and the probes not counted)."""
    m = task.model()
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    times = []
    for step in range(1, task.max_steps + 1):
        t = time.perf_counter()
        bt = task.batch(b, gen)
        opt.zero_grad(set_to_none=True)
        task.loss(m, bt).backward()
        if probe is not None:
            probe.on_step(opt, b)
        if hessian is not None:
            t_h = time.perf_counter()
            hessian.read(m)
            t += time.perf_counter() - t_h
        opt.step()
        times.append(time.perf_counter() - t)
        if step % task.eval_every == 0:
            value = task.eval_loss(m)
            if not math.isfinite(value):
                return {"steps": None, "step_time_s": statistics.median(times), "diverged": True}
            if value <= task.target:
                return {"steps": step, "step_time_s": statistics.median(times)}
    return {"steps": None, "step_time_s": statistics.median(times)}


def seeds_to_target(task: Task, b: int, lr: float, seeds: list[int], limit: float = math.inf) -> dict:
    """Steps until the evaluation loss averaged over the seeds' runs is <= the target: the runs step in lockstep
    and the mean of their losses (an estimate of the expected loss E[L_t], which steps(B) predicts) is checked
    every `eval_every` steps. Not the first step at which one noisy run dips below the target: that comes earlier
    the noisier the run (small batches, large rates), e.g. logreg at B=16, lr 0.19: single runs first dip below at
    201-293 steps, the mean of 4 crosses at 385. Also each seed's own first dip, for comparison, and the median
    time of a training step (evaluation not counted). Stops at `limit` steps (the best so far at this batch: a
    rate that needs more is not picked) with steps None."""
    runs = []
    for seed in seeds:
        m = task.model()
        runs.append((m, torch.optim.SGD(m.parameters(), lr=lr), torch.Generator().manual_seed(seed)))
    times, first = [], [None] * len(seeds)
    for step in range(1, int(min(task.max_steps, limit)) + 1):
        for m, opt, gen in runs:
            t = time.perf_counter()
            bt = task.batch(b, gen)
            opt.zero_grad(set_to_none=True)
            task.loss(m, bt).backward()
            opt.step()
            times.append(time.perf_counter() - t)
        if step % task.eval_every == 0:
            values = [task.eval_loss(m) for m, _, _ in runs]
            if not all(math.isfinite(v) for v in values):
                return {"steps": None, "first_dip": first, "step_time_s": statistics.median(times), "diverged": True}
            first = [f or (step if v <= task.target else None) for f, v in zip(first, values)]
            if statistics.mean(values) <= task.target:
                return {"steps": step, "first_dip": first, "step_time_s": statistics.median(times)}
    return {"steps": None, "first_dip": first, "step_time_s": statistics.median(times)}


def measure_b_noise(task: Task, seed: int) -> dict:
    """B_noise for steps(B) over the run to the target. A reference run (a middle batch, lr_max / 8, slow so
    that it follows the deterministic path) reads, at every step, gpuwise's probe (B_simple, what `watch`
    measures) and the Hessian-weighted B_noise (HessianNoise). The noise scale grows along the run (tens of
    times here), so no single reading is the run's: steps(B) sums (1 + B_t/B) over the run's progress, and
    `goodput.path_b_noise` gives the progress-weighted mean. Kept for comparison: the EMA at the end (at the
    target loss) and the whole-run ratio of means (what `watch` reports as b_simple)."""
    b = task.batch_sizes[len(task.batch_sizes) // 2]
    probe = NoiseProbe(torch, budget_fraction=1.0)
    hess = HessianNoise(task.loss, task.batch, small=max(1, b // 8), parts=8, h_batch=4 * b, seed=seed + 7)
    try:
        ref = train_to_target(task, b, task.lr_max / 8, seed, probe)
    finally:
        probe.examples.disarm()
    # the same run again (same seed: the same batches and path) for the Hessian readings (their extra forward
    # passes would be seen by the probe's global hooks) and the loss at every step, REF_PAST x its steps further
    # than the target: a run with more noise must get its noise-free path below the target
    k = ref["steps"]
    losses = follow(task.model, task.loss, task.batch, task.eval_loss, b, task.lr_max / 8, seed, hess,
                    round(k * (1 + REF_PAST)))
    readings = hess.readings
    # the path over the whole run, the smoothing window included (what `reference.record` gives a user)
    reference = to_path(hess, losses, k, b, task.lr_max / 8, task.target, task.lr_max, PATH_WINDOW)
    hess.readings = readings[:k]  # the noise-scale series below: up to the target, as before
    rows = [dict(zip(ROW_KEYS, r)) for r in probe.rows()]  # rows() hands them over once
    whole = noise_scale(rows)
    evolution = [e["b_simple"] for e in whole["evolution"]]
    h_series, s_series = hess.series(True), hess.series(False)
    h_known = [x for x in h_series if x is not None]
    # the probe's per-step EMA of B_simple (its rows, one per step here), for the path average
    ea = eb = 0.0
    probe_series = []
    for row in rows:
        ea, eb = EMA_DECAY * ea + row["batch"] * row["tr_b"], EMA_DECAY * eb + row["g2"]
        probe_series.append(ea / eb if eb > 0 and ea > 0 else None)
    return {"reference_batch": b, "reference_lr": task.lr_max / 8, "reference_steps": ref["steps"],
            "b_noise": goodput.path_b_noise(h_known, b),
            "b_noise_hessian_end": h_known[-1], "b_noise_hessian_first": h_known[0],
            "hessian_readings": len(hess.readings), "hessian_readings_undefined": len(h_series) - len(h_known),
            "b_simple_path": goodput.path_b_noise([x for x in probe_series if x is not None], b),
            "b_simple_path_same_batches": goodput.path_b_noise([x for x in s_series if x is not None], b),
            "b_simple_end": evolution[-1], "b_simple_whole_run": whole["b_simple"], "ci_low": whole["ci_low"],
            "ci_high": whole["ci_high"], "b_simple_first": evolution[0], "steps_used": whole["steps_used"],
            "estimator": whole["estimator"],
            "hessian_series": h_series, "b_simple_series": probe_series, "path": reference.readings,
            "path_losses": reference.losses, "tr_sigma_at_target": reference.tr_sigma,
            "curvature_at_target": reference.curvature}


def run_task(task: Task, seeds: list[int], save_paths: str | None = None) -> dict:
    noise = measure_b_noise(task, seeds[0] + 100)
    bn = noise["b_noise"]
    points = []
    for b in task.batch_sizes:
        rule = goodput.scaled_lr(task.lr_max, math.inf, b, bn, "linear")  # lr_max / (1 + B_noise / B)
        # the paper's steps(B) assumes the learning rate tuned at each batch: from the rule, doubling while the
        # steps fall (up to lr_max), else halving while they fall
        tried = []

        def attempt(lr, b=b, tried=tried):
            done = [t["steps"] for t in tried if t["steps"]]
            run = seeds_to_target(task, b, lr, seeds, min(done) if done else math.inf)
            tried.append({"lr": lr, "first_dip_runs": run["first_dip"], "steps": run["steps"],
                          "step_time_s": run["step_time_s"]})
            return tried[-1]["steps"] or math.inf

        best_steps = attempt(rule)
        for factor in (2.0, 0.5):
            lr, moved = rule, False
            while len(tried) < 6:
                lr = min(lr * factor, task.lr_max)
                if any(abs(t["lr"] - lr) < 1e-12 for t in tried):
                    break
                got = attempt(lr)
                if got >= best_steps:
                    break
                best_steps, moved = got, True
            if moved:
                break
        done_lr = [t for t in tried if t["steps"]]
        pick = min(done_lr, key=lambda t: t["steps"]) if done_lr else tried[0]
        point = {"batch_size": b, "lr": pick["lr"], "lr_rule": rule, "first_dip_runs": pick["first_dip_runs"],
                 "steps": pick["steps"], "step_time_s": statistics.median(t["step_time_s"] for t in tried),
                 "lr_grid": tried}
        points.append(point)
        print(f"  {task.name} B={b:5d} lr={pick['lr']:.4f} (rule {rule:.4f}) steps={pick['steps']} (first dips {pick['first_dip_runs']}) "
              f"step={point['step_time_s'] * 1e3:.2f} ms",
              file=sys.stderr)
    done = [p for p in points if p["steps"]]
    # predicted steps(B): goodput.steps_along_path over the reference run's readings (eq. 2.4-2.7 step by step,
    # the rate capped at 2 / lambda_max), scaled by least squares to the measured points (the scale does not move
    # the ratios or the best batch)
    # predicted steps(B): goodput.steps_to_target along the reference run's path (one rate per run, searched below
    # lr_max as the runs' is; the noise's settled excess at the target region added to the target), absolute steps
    path, ref_b, ref_lr = noise["path"], noise["reference_batch"], noise["reference_lr"]
    reference = goodput.ReferencePath(path, noise["path_losses"], ref_b, ref_lr, noise["tr_sigma_at_target"],
                                      noise["curvature_at_target"], task.target, task.lr_max)
    if save_paths:
        os.makedirs(save_paths, exist_ok=True)
        with open(os.path.join(save_paths, f"{task.name}.json"), "w") as fh:
            json.dump(reference.to_dict(), fh)

    def predict(batch):
        return reference.steps(batch)

    pred = {p["batch_size"]: predict(p["batch_size"]) for p in points}
    f = [goodput.steps_factor(p["batch_size"], bn) for p in done]
    s_min = sum(fi * p["steps"] for fi, p in zip(f, done)) / sum(fi * fi for fi in f)
    a, per = goodput.fit_step_time([(p["batch_size"], p["step_time_s"]) for p in points])
    for p in points:
        p["predicted_steps"], p["predicted_lr"], p["path_limited"] = pred[p["batch_size"]]
        p["predicted_steps_eq_2_11"] = s_min * goodput.steps_factor(p["batch_size"], bn)
        p["time_to_target_s"] = p["steps"] * p["step_time_s"] if p["steps"] else None
        p["predicted_time_to_target_s"] = p["predicted_steps"] * p["step_time_s"]  # step_time(B) measured
    measured_best = min(done, key=lambda p: p["time_to_target_s"])["batch_size"]
    # the predicted best: what `tune --objective goodput --reference-path` answers on these step times
    times = {p["batch_size"]: p["step_time_s"] for p in points}
    advice = goodput.advise(None, times.__getitem__, list(times), path=reference)
    predicted_best = advice.batch_size
    lo, hi = done[0], done[-1]
    measured_ratio = lo["steps"] / hi["steps"]
    predicted_ratio = pred[lo["batch_size"]][0] / pred[hi["batch_size"]][0]
    bs = [p["batch_size"] for p in points]
    curve = [(x, predict(x)[0]) for x in (bs[0] * (bs[-1] / bs[0]) ** (i / 40) for i in range(41))]
    # before: the one-step model summed along the path to the target (steps_along_path, the rate at each step
    # the one-step best, capped at 2 / lambda_max and lr_max), with and without the stability cap
    k = noise["reference_steps"]
    one = {x: goodput.steps_along_path(path[:k], x, ref_b, ref_lr, task.lr_max) for x in bs}
    nocap = [(g2, ghg, trh, 0.0) for g2, ghg, trh, _ in path[:k]]
    one_nc = {x: goodput.steps_along_path(nocap, x, ref_b, ref_lr) for x in bs}
    one_step = {}
    for name, sh in (("capped", one), ("uncapped", one_nc)):
        pr = sh[lo["batch_size"]] / sh[hi["batch_size"]]
        one_step[name] = {"predicted_best_batch": min(points, key=lambda p, sh=sh: sh[p["batch_size"]] * p["step_time_s"])[
            "batch_size"], "predicted_ratio": pr, "ratio_error": pr / measured_ratio - 1}
    # the same prediction from the other readings of the noise scale (the criteria use b_noise)
    alternatives = {}
    for key in ("b_noise", "b_simple_path", "b_simple_end", "b_simple_whole_run", "b_noise_hessian_end"):
        v = noise.get(key)
        if not v or v <= 0:
            continue
        pb = min(points, key=lambda p, v=v: goodput.steps_factor(p["batch_size"], v) * p["step_time_s"])["batch_size"]
        pr = goodput.steps_factor(lo["batch_size"], v) / goodput.steps_factor(hi["batch_size"], v)
        alternatives[key] = {"b_noise": v, "predicted_best_batch": pb, "predicted_ratio": pr,
                             "ratio_error": pr / measured_ratio - 1}
    return {"task": task.name, "target_loss": task.target, "lr_max": task.lr_max, "noise": noise, "s_min": s_min,
            "curve": curve, "path_limited_batches": [p["batch_size"] for p in points if p["path_limited"]],
            "one_step_path_model": one_step, "alternatives_eq_2_11": alternatives,
            "step_time_fit": {"fixed_s": a, "per_sample_s": per}, "points": points,
            "measured_best_batch": measured_best, "predicted_best_batch": predicted_best,
            "best_within_2x": max(measured_best, predicted_best) / min(measured_best, predicted_best) <= 2,
            "steps_ratio": {"batches": [lo["batch_size"], hi["batch_size"]], "measured": measured_ratio,
                            "predicted": predicted_ratio, "error": predicted_ratio / measured_ratio - 1},
            "ratio_within_30pct": abs(predicted_ratio / measured_ratio - 1) <= 0.30}


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(results), figsize=(4.2 * len(results), 6.4), squeeze=False)
    for j, r in enumerate(results):
        pts = r["points"]
        bs = [p["batch_size"] for p in pts]
        grid = [bs[0] * (bs[-1] / bs[0]) ** (i / 60) for i in range(61)]
        n = r["noise"]
        ax = axes[0][j]
        ax.plot([x for x, _ in r["curve"]], [y for _, y in r["curve"]], "-", color="C0",
                label="predicted: noise-free path to target - noise floor")
        end = n["b_simple_end"]
        if end:
            f_end = [goodput.steps_factor(p["batch_size"], end) for p in pts if p["steps"]]
            s_end = sum(f * p["steps"] for f, p in zip(f_end, [p for p in pts if p["steps"]])) / sum(f * f for f in f_end)
            ax.plot(grid, [s_end * goodput.steps_factor(b, end) for b in grid], ":", color="C2",
                    label=f"before: S_min(1 + B_noise/B), B_simple at target={end:.0f}")
        for p in pts:
            ax.plot([p["batch_size"]] * len([s for s in p["first_dip_runs"] if s]), [s for s in p["first_dip_runs"] if s],
                    ".", color="C1", alpha=0.5)
        ax.plot([p["batch_size"] for p in pts if p["steps"]], [p["steps"] for p in pts if p["steps"]], "o", color="C1",
                label="measured: the seeds' mean loss reaches the target")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{r['task']}: steps to loss {r['target_loss']:.3f}")
        ax.set_xlabel("batch size")
        ax.legend(fontsize=7)
        ax = axes[1][j]
        ax.plot(bs, [p["predicted_time_to_target_s"] for p in pts], "-", color="C0",
                label="predicted steps x measured step time")
        ax.plot([p["batch_size"] for p in pts if p["steps"]], [p["time_to_target_s"] for p in pts if p["steps"]],
                "o", color="C1", label="measured")
        ax.axvline(r["predicted_best_batch"], color="C0", ls=":", label=f"predicted best {r['predicted_best_batch']}")
        ax.axvline(r["measured_best_batch"], color="C1", ls="--", label=f"measured best {r['measured_best_batch']}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_ylabel("seconds to target (CPU)")
        ax.legend(fontsize=7)
    fig.suptitle("gpuwise goodput: steps and time to a target loss vs batch (LR tuned at each batch by doubling/halving)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--seeds", type=int, default=3, help="training runs per batch size (default 3)")
    p.add_argument("--first-seed", type=int, default=0, help="the seeds are FIRST..FIRST+SEEDS-1 (the training runs' "
                   "batches; the reference run's is FIRST+100): another draw of every measurement (default 0)")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "goodput_validate.json"))
    p.add_argument("--plot", default=os.path.join(ROOT, "docs", "goodput-validate.png"))
    p.add_argument("--replot", action="store_true", help="only redraw the plot from the results file")
    p.add_argument("--save-paths", default=os.path.join(ROOT, "benchmarks", "results", "goodput_paths"), metavar="DIR",
                   help="write each task's reference path (goodput.ReferencePath JSON, for `tune --objective goodput "
                        "--reference-path`) to DIR/TASK.json (default benchmarks/results/goodput_paths; '' for none)")
    args = p.parse_args(argv)
    if args.replot:
        with open(args.out) as fh:
            plot(json.load(fh)["tasks"], args.plot)
        return 0
    torch.set_num_threads(1)
    t0 = time.time()
    results = []
    for name in args.tasks.split(","):
        task = TASKS[name]()
        print(f"{name}: target loss {task.target:.4f}", file=sys.stderr)
        n = max(args.seeds, task.min_seeds)
        r = run_task(task, list(range(args.first_seed, args.first_seed + n)), args.save_paths)
        r["seeds"] = n
        print(f"  B_noise {r['noise']['b_noise']:.1f} (EMA at the start {r['noise']['b_simple_first']:.1f}, whole run "
              f"{r['noise']['b_simple_whole_run']:.1f}); best batch "
              f"measured {r['measured_best_batch']} predicted {r['predicted_best_batch']}; steps ratio "
              f"{r['steps_ratio']['batches']}: measured {r['steps_ratio']['measured']:.2f} predicted "
              f"{r['steps_ratio']['predicted']:.2f}; predictions limited by the reference run's end: "
              f"{r['path_limited_batches'] or 'none'}", file=sys.stderr)
        results.append(r)
    out = {"command": "python benchmarks/goodput_validate.py " + " ".join(argv or sys.argv[1:]),
           "torch": torch.__version__, "cpu_count": os.cpu_count(), "seconds": time.time() - t0,
           "load_average": os.getloadavg(), "tasks": results}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)
    plot(results, args.plot)
    print(json.dumps({r["task"]: {"best_within_2x": r["best_within_2x"], "ratio_within_30pct": r["ratio_within_30pct"]}
                      for r in results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
