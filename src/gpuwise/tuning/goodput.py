"""Goodput: the batch size (and learning rate) that reaches a target loss soonest, from the gradient noise scale.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", eq. 2.11 and section 2.3): with the
learning rate tuned at each batch size, the optimizer steps to a given loss follow

    steps(B) = S_min (1 + B_noise / B)

so time to target = steps(B) x step_time(B). S_min does not change where the minimum is, so the answer only
needs B_noise (here B_simple, measured by `gpuwise watch`, monitoring/noise_scale.py) and step_time(B)
(measured, or from the planner). With step_time(B) = a + b B (a fixed cost per step plus a cost per sample,
as on one device below its saturation), the minimum is at B* = sqrt(B_noise a / b).

Measured against training to a target loss (benchmarks/goodput_validate.py), the one-step model (eq. 2.4-2.7)
charges SGD's noise as a loss added at every step, e^2 tr(H Sigma) / 2B, and sums it along the run. That
noise settles instead: a quadratic's excess over the noise-free path stays at lr tr(Sigma) / (2B (2 - lr c))
(`noise_floor`), the noise of a step decaying within ~1 / (lr lambda) steps. `steps_to_target` predicts steps(B)
from that: one learning rate per run, the noise-free path followed to the target minus the floor.

The learning rate at the new batch: the same paper's eq. 2.7 gives the best SGD step at B as
lr_max / (1 + B_noise / B): linear in B well below B_noise (Goyal et al. 2017, "Accurate, Large Minibatch
SGD"), flat above it. Adam-like optimizers scale closer to sqrt(B) (Malladi et al. 2022, "On the SDEs and
Scaling Rules for Adaptive Gradient Algorithms"; Hoffer et al. 2017), with the same saturation. A learning
rate raised by more than 2x is warmed up linearly (Goyal et al. 2017: 5 epochs, here 5% of the steps).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

WARMUP_ABOVE = 2.0       # warm up when the learning rate grows by more than this factor (Goyal et al. 2017)
WARMUP_FRACTION = 0.05   # ... linearly over this share of the run's steps
FULL_STEP = 1e-3         # |1 - e c| below this counts as this: a step at e = 1/c takes a quadratic's loss along G to
                         # 0, but a real gradient is spread over H's directions and keeps some of it
ADAPTIVE = ("adam", "adamw", "adamax", "nadam", "radam", "adagrad", "adafactor", "rmsprop", "lamb", "lion")


def steps_factor(batch: float, b_noise: float) -> float:
    """steps(B) / S_min = 1 + B_noise / B (McCandlish et al. 2018, eq. 2.11)."""
    return 1.0 + b_noise / batch


def path_b_noise(readings: Sequence[float], batch: float) -> float:
    """The one B_noise that gives a whole run's steps(B) when the noise scale changes along the run.

    Eq. 2.11 holds step by step: a step at batch B with noise scale B_t makes the progress of
    1 / (1 + B_t / B) steps at B -> infinity (McCandlish et al. 2018, section 2.2: the expected improvement
    at the tuned rate is dL_max / (1 + B_noise/B)). Summed over a run to the target, steps(B) = sum over its
    S_min progress of (1 + B_t/B) = S_min (1 + B_bar/B), with B_bar the mean of B_t weighted by each step's
    S_min progress. `readings` are B_t at the steps of a reference run at `batch` (one per step, smoothed),
    each weighing 1 / (1 + B_t/batch). Not the value at the end (the largest: B_noise grows as the loss
    falls) nor the ratio of whole-run means (the early, large |G|^2 dominates it)."""
    pts = [max(float(b), 0.0) for b in readings if b is not None and math.isfinite(b)]
    if not pts or batch <= 0:
        raise ValueError("no noise-scale readings to average")
    w = [1.0 / (1.0 + b / batch) for b in pts]
    return sum(wi * b for wi, b in zip(w, pts)) / sum(w)


def centred_means(rows: Sequence[Sequence[float]], window: float) -> list[list[float]]:
    """Each row replaced by the column-wise mean of the rows within `window` (a fraction of len(rows), at least
    one row) on either side: smoothing without the lag of an exponential moving average, for readings along
    a finished run whose values change faster than their noise averages out."""
    n = len(rows)
    half = max(1, round(window * n))
    out = []
    for i in range(n):
        seg = rows[max(0, i - half):i + half + 1]
        out.append([sum(col) / len(seg) for col in zip(*seg)])
    return out


def steps_along_path(path: Sequence[tuple[float, float, float, float]], batch: float, ref_batch: float,
                     ref_lr: float, lr_cap: float = math.inf) -> float:
    """steps(B) to cover the loss a reference run covered, from its readings along the way, with the learning
    rate tuned at B but held below gradient descent's stability limit.

    Each reading (|G|^2, G'HG, tr(H Sigma), lambda_max) is a point of the reference run (SGD at `ref_lr`,
    `ref_batch`). The paper's local model (McCandlish et al. 2018, eq. 2.4-2.7): a step of lr e at batch B
    lowers the loss by dL(e, B) = e |G|^2 - e^2 / 2 (G'HG + tr(H Sigma) / B), best at
    e_opt(B) = |G|^2 / (G'HG + tr(H Sigma)/B). The model has no stability limit: along H's top eigenvector
    repeated steps diverge above e = 2 / lambda_max (gradient descent on a quadratic; Cohen et al. 2021, "Gradient
    Descent on Neural Networks Typically Occurs at the Edge of Stability"), and where that is below e_opt the
    rate is capped there, so e(B) = min(e_opt(B), 2 / lambda_max, lr_cap) (`lr_cap`: the largest rate the runs
    may use, if any). A reference step covers
    dL(ref_lr, ref_batch); at B that takes dL(ref_lr, ref_batch) / dL(e(B), B) steps; steps(B) is their sum.
    Without the cap this is eq. 2.11 along the path: S_min (1 + B_bar / B), B_bar = path_b_noise's mean."""
    total = 0.0
    for g2, ghg, trh, lam in path:
        if g2 <= 0 or ghg <= 0:
            continue  # negative curvature along G: the quadratic model has no best step here
        trh = max(trh, 0.0)
        covered = ref_lr * g2 - ref_lr ** 2 / 2 * (ghg + trh / ref_batch)
        if covered <= 0:
            continue
        curv = ghg + trh / batch
        e = g2 / curv
        if lam and lam > 0:
            e = min(e, 2.0 / lam)
        e = min(e, lr_cap)
        gain = e * g2 - e * e / 2 * curv
        total += covered / gain
    if total <= 0:
        raise ValueError("no usable readings along the path")
    return total


def noise_floor(lr: float, batch: float, tr_sigma: float, curvature: float = 0.0) -> float:
    """The expected loss SGD's noise holds above the noise-free path, once it has settled: lr tr(Sigma) /
    (2B (2 - lr c)) (a quadratic's stationary excess, sum over H's directions of lr sigma_i^2 / (2B (2 - lr
    lambda_i)), with one curvature c = tr(H Sigma) / tr(Sigma) for all; lr tr(Sigma) / (4B) when lr c << 1).
    inf where lr c >= 2 (the noise's directions are unstable). The noise injected by a step decays within about
    1 / (lr lambda) steps, so it costs a fixed excess, not a loss that accumulates step after step as the
    one-step model (eq. 2.4-2.7) charges it."""
    if lr * curvature >= 2:
        return math.inf
    return lr * tr_sigma / (2 * batch * (2 - lr * curvature))


def reference_steps_per_step(lr: float, ref_lr: float, curvature: float) -> float:
    """How many of the reference run's steps (rate `ref_lr`) one step at rate `lr` covers where the gradient's
    curvature is `curvature` (G'HG / |G|^2); 0 where the step makes no progress (lr c >= 2).

    Eq. 2.4 without the noise term: a step at e lowers the loss by e |G|^2 - e^2/2 G'HG, the fraction
    f(e) = 1 - (1 - e c)^2 of the loss along G. The ratio f(lr) / f(ref_lr) is what one step covers only while
    both fractions are small. A step larger than the reference's spans several reference steps, and along G the
    loss shrinks geometrically, by (1 - e c)^2 a step (exactly, on a quadratic), so it covers
    ln|1 - lr c| / ln|1 - ref_lr c| reference steps, more than the ratio. Logistic regression at lr 4, B 16384:
    e c = 0.8 at the start, one step removes 96 % of the loss along G; summing the ratio gave 8.7 steps to the
    target for 5 measured (the -39 % on its steps ratio), the geometric count 5. A step smaller than the
    reference's keeps the ratio: compounding there would credit the reference's own step with a contraction at
    its c, and late in a noisy run c is the curvature of the noise its steps put in H's sharp directions, not
    of its progress (the LM: ref_lr c 0.8-0.9 while its loss fell 0.1 % a step; compounded, its B = 2 came out
    at 678 steps for 350 measured)."""
    def frac(e: float) -> float:
        return 1.0 - (1.0 - e * curvature) ** 2

    if frac(lr) <= 0:
        return 0.0
    if frac(ref_lr) <= 0:
        return lr / ref_lr  # no curvature reading to go by: the path's length in rate units
    ratio = frac(lr) / frac(ref_lr)
    a, b = abs(1.0 - lr * curvature), abs(1.0 - ref_lr * curvature)
    if lr <= ref_lr or b >= 1.0 or b <= 0.0:
        return ratio
    return max(ratio, math.log(max(a, FULL_STEP)) / math.log(b))


def steps_to_target(path: Sequence[tuple[float, float, float, float]], losses: Sequence[float], target: float,
                    batch: float, ref_batch: float, ref_lr: float, tr_sigma: float, curvature: float = 0.0,
                    lr_cap: float = math.inf, grid: float = 2 ** 0.125) -> tuple[float, float, bool]:
    """(steps, learning rate, path_limited): the fewest steps at `batch` to bring the expected loss to `target`
    with one learning rate for the whole run (as the runs use), and that rate.

    The expected loss at batch B and rate e is the noise-free path's plus `noise_floor(e, B)`: the run must
    follow the path down to target - floor. `path` and `losses` come from a reference run (SGD at `ref_lr`,
    `ref_batch`) past the target: (|G|^2, G'HG, -, lambda_max) and the loss at each of its steps, smoothed; the
    reference's own floor is taken off its losses. Along the path, a step at rate e covers what
    (e |G|^2 - e^2/2 G'HG) / (ref_lr |G|^2 - ref_lr^2/2 G'HG) reference steps cover (eq. 2.4-2.7 without the noise
    term; e capped at 2 / lambda_max there, gradient descent's stability limit). The rate is searched on a
    geometric grid below `lr_cap`. `tr_sigma` and `curvature` (tr(H Sigma) / tr(Sigma)) are the noise at the
    target. path_limited: the next rate up would need the path further than the reference run went (a longer
    run could lower the steps: run the reference further). (inf, nan, False) when no rate reaches the target.
    """
    n = min(len(path), len(losses))
    if n == 0 or batch <= 0 or ref_lr <= 0:
        raise ValueError("no reference path to follow")
    ref_floor = noise_floor(ref_lr, ref_batch, tr_sigma, curvature)
    clean = [loss - (ref_floor if math.isfinite(ref_floor) else 0.0) for loss in losses[:n]]
    top = lr_cap if math.isfinite(lr_cap) else 4 * max((g2 / ghg for g2, ghg, _, _ in path if g2 > 0 and ghg > 0),
                                                        default=ref_lr)
    best = (math.inf, math.nan, False)
    e, short = top, False
    while e > top * 1e-4:
        goal = target - noise_floor(e, batch, tr_sigma, curvature)
        k = next((i for i, loss in enumerate(clean) if loss <= goal), None)
        if k is not None:
            total = 0.0
            for g2, ghg, _, lam in path[:k]:
                step = min(e, 2.0 / lam) if lam and lam > 0 else e
                if g2 <= 0 or ghg <= 0:
                    total += ref_lr / step  # no curvature reading: the path's length in rate units
                    continue
                worth = reference_steps_per_step(step, ref_lr, ghg / g2)
                if worth <= 0:
                    total = math.inf  # past twice the best step along G: no progress at this rate
                    break
                total += 1.0 / worth
            if total < best[0]:
                best = (total, e, short)
        short = k is None
        e /= grid
    return best


@dataclass
class ReferencePath:
    """A reference run's path to and past a target loss: what `steps_to_target` follows, for any batch.

    `readings`: (|G|^2, G'HG, tr(H Sigma), lambda_max) at each of the reference run's steps and `losses` the loss
    before each step (and after the last), both smoothed; the run was SGD at `lr`, `batch`. `tr_sigma` and
    `curvature` (tr(H Sigma) / tr(Sigma)) are the noise at the target. `lr_max`: the largest rate a run may use.
    benchmarks/goodput_validate.py records one per task (`--save-paths DIR`); `tune --objective goodput
    --reference-path FILE` predicts steps(B) from one."""
    readings: list
    losses: list
    batch: int
    lr: float
    tr_sigma: float
    curvature: float
    target: float
    lr_max: float = math.inf

    def steps(self, batch: float, target: float | None = None) -> tuple[float, float, bool]:
        """(steps, learning rate, path_limited) at `batch`: `steps_to_target` along this path."""
        return steps_to_target(self.readings, self.losses, self.target if target is None else target, batch,
                               self.batch, self.lr, self.tr_sigma, self.curvature, self.lr_max)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["lr_max"] = None if math.isinf(self.lr_max) else self.lr_max
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ReferencePath:
        need = ("readings", "losses", "batch", "lr", "tr_sigma", "curvature", "target")
        missing = [k for k in need if d.get(k) is None]
        if missing:
            raise ValueError(f"a reference path needs {', '.join(missing)}")
        readings = [tuple(float(x) for x in r) for r in d["readings"]]
        if not readings or any(len(r) != 4 for r in readings) or len(d["losses"]) < len(readings):
            raise ValueError("a reference path needs one (|G|^2, G'HG, tr(H Sigma), lambda_max) reading a step and "
                             "a loss before each step")
        lr_max = d.get("lr_max")
        return cls(readings, [float(x) for x in d["losses"]], int(d["batch"]), float(d["lr"]), float(d["tr_sigma"]),
                   float(d["curvature"]), float(d["target"]), math.inf if lr_max is None else float(lr_max))


def best_batch_linear_time(b_noise: float, fixed_s: float, per_sample_s: float) -> float:
    """The B minimising (1 + B_noise/B)(a + b B): d/dB = 0 at B = sqrt(B_noise a / b)."""
    if per_sample_s <= 0:
        return math.inf
    return math.sqrt(b_noise * max(fixed_s, 0.0) / per_sample_s)


def fit_step_time(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(a, b) of step_time(B) = a + b B, least squares over measured (B, seconds) points, a and b >= 0."""
    n = len(points)
    if n == 0:
        raise ValueError("no step times to fit")
    if n == 1:
        b0, t0 = points[0]
        return 0.0, t0 / b0
    mb = sum(b for b, _ in points) / n
    mt = sum(t for _, t in points) / n
    var = sum((b - mb) ** 2 for b, _ in points)
    slope = sum((b - mb) * (t - mt) for b, t in points) / var if var > 0 else mt / mb
    slope = max(slope, 0.0)
    return max(mt - slope * mb, 0.0), slope


def lr_rule(optimizer: str | None) -> tuple[str, str]:
    """("linear" | "sqrt", why) for an optimizer class name (SGD, AdamW, ...)."""
    name = (optimizer or "").lower()
    if any(name.startswith(a) for a in ADAPTIVE):
        return "sqrt", (f"{optimizer} normalises by the gradient's second moment: its learning rate scales about as "
                        "sqrt(B) (Malladi et al. 2022; Hoffer et al. 2017), saturating above B_noise")
    if name:
        return "linear", (f"{optimizer} is plain/momentum SGD: the best learning rate is lr_max / (1 + B_noise/B) "
                          "(McCandlish et al. 2018, eq. 2.7): linear in B below B_noise (Goyal et al. 2017), flat above")
    return "sqrt", "optimizer unknown: square-root scaling, the more cautious of the two rules"


def scaled_lr(lr: float, batch_from: float, batch_to: float, b_noise: float, rule: str) -> float:
    """The learning rate at `batch_to` given a good one at `batch_from`: eq. 2.7's lr_max/(1 + B_noise/B) for
    SGD (linear far below B_noise), its square root for Adam-like optimizers."""
    ratio = steps_factor(batch_from, b_noise) / steps_factor(batch_to, b_noise)
    return lr * (ratio if rule == "linear" else math.sqrt(ratio))


@dataclass
class GoodputPoint:
    batch_size: int
    step_time_s: float
    steps_factor: float          # steps(B) / S_min
    time_factor_s: float         # steps_factor x step_time_s: time to target / S_min
    measured: bool = True
    steps: float | None = None   # reference_path: the predicted steps to the target (steps_factor is these)
    lr: float | None = None      # reference_path: the learning rate of those steps
    path_limited: bool | None = None  # reference_path: a longer reference run might lower the steps


@dataclass
class GoodputAdvice:
    b_noise: float
    batch_size: int              # the recommendation (global batch)
    current_batch_size: int | None
    per_gpu_batch_size: int
    n_gpus: int
    lr_rule: str
    lr_rule_why: str
    lr_factor: float             # multiply the current learning rate by this
    warmup: str | None
    speedup: float | None        # predicted time to target, current / recommended
    points: list[GoodputPoint] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    steps_model: str = "eq_2_11"  # "eq_2_11": S_min (1 + B_noise / B); "reference_path": steps_to_target
    lr: float | None = None       # reference_path: the learning rate at the recommended batch

    def to_dict(self) -> dict:
        return asdict(self)


def advise(b_noise: float | None, step_time: Callable[[int], float], candidates: Sequence[int],
           current_batch: int | None = None, n_gpus: int = 1, optimizer: str | None = None,
           measured: Sequence[int] = (), path: ReferencePath | None = None,
           target: float | None = None) -> GoodputAdvice:
    """The candidate global batch with the least predicted time to target, steps(B) x step_time(B).

    steps(B): with a reference `path`, `steps_to_target` along it (the steps and the learning rate at each batch;
    `target` overrides the path's target loss), else eq. 2.11's S_min (1 + B_noise / B) (steps_factor is then
    per S_min). `step_time(B)` is the time of one optimizer step at global batch B on `n_gpus` (measured or
    planned); candidates should be multiples of `n_gpus`."""
    if path is None and (b_noise is None or b_noise <= 0 or not math.isfinite(b_noise)):
        raise ValueError(f"the noise scale must be positive and finite, got {b_noise}")
    if n_gpus < 1:
        raise ValueError(f"n_gpus must be at least 1, got {n_gpus}")
    points = []
    for b in sorted(set(candidates)):
        t = step_time(b)
        if path is not None:
            steps, lr, limited = path.steps(b, target)
            points.append(GoodputPoint(b, t, steps, steps * t, b in measured, steps, None if math.isnan(lr) else lr,
                                       limited))
        else:
            f = steps_factor(b, b_noise)
            points.append(GoodputPoint(b, t, f, f * t, b in measured))
    if not points:
        raise ValueError("no candidate batch sizes")
    best = min(points, key=lambda p: p.time_factor_s)
    if not math.isfinite(best.time_factor_s):
        raise ValueError("no candidate batch reaches the target along the reference path"
                         if path is not None else "no candidate batch has a step time")
    now = next((p for p in points if p.batch_size == current_batch), None)
    notes = []
    if path is not None:
        rule, why = "path", (f"the rate at which the run reaches the target in the fewest steps along the reference "
                             f"path (steps_to_target, searched below lr_max {path.lr_max:g}); the reference ran "
                             f"SGD at lr {path.lr:g}, batch {path.batch}")
        factor = best.lr / now.lr if now is not None and now.lr else best.lr / path.lr
        if now is None or not now.lr:
            notes.append(f"learning-rate factor relative to the reference run's lr {path.lr:g}")
        notes.append(f"steps(B) from the reference path to loss {path.target if target is None else target:g}: "
                     + ", ".join(f"B={p.batch_size} {p.steps:.0f} steps at lr {p.lr:.3g}" for p in points
                                 if p.steps is not None and math.isfinite(p.steps)))
        if any(p.path_limited for p in points):
            notes.append("the reference path ended before some batches' best rate: record a longer reference run")
    else:
        rule, why = lr_rule(optimizer)
        factor = scaled_lr(1.0, current_batch or best.batch_size, best.batch_size, b_noise, rule)
    warmup = (f"warm up linearly from the current learning rate over the first {WARMUP_FRACTION:.0%} of the steps "
              f"(the rate grows x{factor:.2f}; Goyal et al. 2017)") if factor > WARMUP_ABOVE else None
    speedup = None
    if current_batch:
        if now is None:
            now = GoodputPoint(current_batch, step_time(current_batch), 0.0, 0.0)
            now.time_factor_s = (path.steps(current_batch, target)[0] if path is not None
                                 else steps_factor(current_batch, b_noise)) * now.step_time_s
        speedup = now.time_factor_s / best.time_factor_s if math.isfinite(now.time_factor_s) else None
    return GoodputAdvice(b_noise, best.batch_size, current_batch, max(best.batch_size // n_gpus, 1), n_gpus,
                         rule, why, factor, warmup, speedup, points, notes,
                         "reference_path" if path is not None else "eq_2_11", best.lr)


def from_trials(trials, b_noise: float | None, current_batch: int | None, n_gpus: int = 1,
                optimizer: str | None = None, path: ReferencePath | None = None,
                target: float | None = None) -> GoodputAdvice:
    """`tune WORKLOAD --objective goodput`: step_time(B) = B / samples_per_s of the tune's measured trials (the
    end-to-end `train` trials where there are, else `compute`), at each batch size measured."""
    compute: dict[int, float] = {}
    train: dict[int, float] = {}
    for t in trials:
        rate = t.rate
        if rate and t.kind in ("compute", "train"):
            into = train if t.kind == "train" else compute
            into[t.batch_size] = max(into.get(t.batch_size, 0.0), rate)
    rates = {**compute, **train}  # the end-to-end rate (loader included) where it was measured
    if not rates:
        raise ValueError("no batch size was measured: nothing to weigh the noise scale against")
    batches = [b for b in sorted(rates) if b % n_gpus == 0] or sorted(rates)
    adv = advise(b_noise, lambda b: b / rates[b] if b in rates else math.inf, batches, current_batch
                 if current_batch in rates else None, n_gpus, optimizer, measured=batches, path=path, target=target)
    adv.notes.append(f"step time measured at batch sizes {batches} (B / samples_per_s of the tune's trials)")
    return adv


def from_one_batch(b_noise: float, current_batch: int, n_gpus: int = 1, optimizer: str | None = None) -> GoodputAdvice:
    """`tune --objective goodput -- CMD`: the script's batch is its own, so step time is known at that batch only.
    Without step_time(B) the balanced choice is B = B_noise (the critical batch: twice the minimum steps and
    twice the minimum samples, McCandlish et al. 2018 eq. 2.13), in a power of two and in whole per-GPU batches."""
    target = max(n_gpus, round(2 ** round(math.log2(max(b_noise, 1.0))) / n_gpus) * n_gpus)
    rule, why = lr_rule(optimizer)
    factor = scaled_lr(1.0, current_batch, target, b_noise, rule)
    warmup = (f"warm up linearly from the current learning rate over the first {WARMUP_FRACTION:.0%} of the steps "
              f"(the rate grows x{factor:.2f}; Goyal et al. 2017)") if factor > WARMUP_ABOVE else None
    fewer = steps_factor(current_batch, b_noise) / steps_factor(target, b_noise)
    return GoodputAdvice(b_noise, target, current_batch, target // n_gpus, n_gpus, rule, why, factor, warmup, None,
                         [], [f"step time known at the script's batch ({current_batch}) only: batch B_noise is the "
                              f"critical batch (x2 the minimum steps and x2 the minimum samples); steps to the same "
                              f"loss x{1 / fewer:.2f} of now, samples x{(target + b_noise) / (current_batch + b_noise):.2f}"])


def from_path_one_batch(path: ReferencePath, current_batch: int, n_gpus: int = 1,
                        target: float | None = None) -> GoodputAdvice:
    """`tune --objective goodput --reference-path FILE -- CMD`: step time known at the script's batch only, so the
    answer is the critical batch of the reference path: the smallest power of two (in whole per-GPU batches) whose
    predicted steps to the target are within twice the fewest (at a batch of 2^24), as `from_one_batch` is for
    eq. 2.11; its learning rate is the path's."""
    s_min, _, _ = path.steps(2 ** 24, target)
    if not math.isfinite(s_min):
        raise ValueError("no batch reaches the target along the reference path")
    now_steps, now_lr, _ = path.steps(current_batch, target)
    pick = None
    for k in range(25):
        b = max(n_gpus, round(2 ** k / n_gpus) * n_gpus)
        steps, lr, limited = path.steps(b, target)
        if steps <= 2 * s_min:
            pick = GoodputPoint(b, math.nan, steps, math.nan, False, steps, lr, limited)
            break
    factor = pick.lr / now_lr if math.isfinite(now_lr) and now_lr else pick.lr / path.lr
    warmup = (f"warm up linearly from the current learning rate over the first {WARMUP_FRACTION:.0%} of the steps "
              f"(the rate grows x{factor:.2f}; Goyal et al. 2017)") if factor > WARMUP_ABOVE else None
    notes = [f"step time known at the script's batch ({current_batch}) only: the critical batch of the reference path "
             f"(within 2x the fewest steps, {s_min:.0f}): {pick.steps:.0f} steps at lr {pick.lr:.3g} for "
             f"{now_steps:.0f} at the script's batch"]
    return GoodputAdvice(None, pick.batch_size, current_batch, pick.batch_size // n_gpus, n_gpus, "path",
                         f"the rate with the fewest steps to the target along the reference path (SGD at lr {path.lr:g}, "
                         f"batch {path.batch})", factor, warmup, None, [pick], notes, "reference_path", pick.lr)


def load_path(file: str) -> ReferencePath:
    """A ReferencePath from a JSON file (ReferencePath.to_dict()); ValueError with one line when it is not one."""
    import json

    try:
        with open(file) as fh:
            data = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read the reference path {file}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{file}: not a reference path (a JSON object)")
    return ReferencePath.from_dict(data)
