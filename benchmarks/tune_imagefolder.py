"""gpuwise tune on examples:imagefolder vs the workload as given and vs an exhaustive grid (issue 5).

    python benchmarks/tune_imagefolder.py                 # on the GPU if there is one, else the CPU
    python benchmarks/tune_imagefolder.py --device cpu --budget 5m --measure 1s

1. `gpuwise.tune` with a budget (fresh results file): its answer, its trials and their time.
2. The exhaustive grid over the same settings (batch x num_workers x prefetch_factor x
   persistent_workers [x pin_memory on CUDA], the precision(s) the tuner considered), run with the same
   trial function in the same isolated children: every point's samples/s and the grid's total time.
3. Confirmation: the defaults, the tuned answer and the grid's best re-measured interleaved, `--confirm`
   times each; the ratios use the medians (a grid's single-shot maximum is biased upwards).
Goal: tuned >= 0.97 x the grid's best, in <= 15% of the grid's time.

On CUDA also: Lightning's BatchSizeFinder and accelerate's find_executable_batch_size on the same
workload (trials, seconds to answer, whether a full epoch at their answer survives), and the tuned
samples/s as a fraction of the compute-only limit (goal >= 0.9). Those columns are skipped without CUDA
(or without the package). Results: benchmarks/results/tune_imagefolder-<device>.json (+ .jsonl trials).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time

WORKLOAD = "examples:imagefolder"
HERE = os.path.dirname(os.path.abspath(__file__))


def grid_points(device_type: str, batches: list[int], max_workers: int, precisions: list[str]) -> list[dict]:
    pins = [False, True] if device_type == "cuda" else [False]  # pinning needs CUDA
    points = []
    for b, prec, pin, w in itertools.product(batches, precisions, pins, range(max_workers + 1)):
        extras = [(None, False)] if w == 0 else list(itertools.product([None, 4], [False, True]))
        for prefetch, persistent in extras:
            points.append({"batch_size": b, "precision": prec, "pin_memory": pin, "num_workers": w,
                           "prefetch_factor": prefetch, "persistent_workers": persistent})
    return points


def run_point(point: dict, device: str, measure_s: float, store, timeout_s: float = 600) -> dict:
    """One end-to-end trial, exactly as the tuner runs it (same child function, same thread rule)."""
    from gpuwise.measuring.child import run_isolated
    from gpuwise.tuning.trials import step_threads, usable_cpus

    settings = {"workload": WORKLOAD, "device": device, "kind": "train", "optimizer": None,
                "measure_s": measure_s, **point}
    old = store.get(settings) if store is not None else None
    if old is not None:
        return old
    kwargs = {k: v for k, v in settings.items()}
    kwargs["num_threads"] = step_threads(device.split(":")[0], point["num_workers"], usable_cpus())
    res = run_isolated("gpuwise.tuning.trials:run_trial", kwargs, timeout_s=timeout_s)
    rec = {**settings, "status": res.status, "samples_per_s": (res.value or {}).get("samples_per_s"),
           "seconds": round(res.seconds, 3), "error": res.error or None}
    if store is not None:
        store.add(rec)
    return rec


def settings_of(d: dict) -> dict:
    return {k: d.get(k) for k in ("batch_size", "precision", "pin_memory", "num_workers", "prefetch_factor",
                                  "persistent_workers")}


def fmt(d: dict) -> str:
    s = f"b={d['batch_size']} w={d['num_workers']}"
    if d.get("pin_memory"):
        s += " pin"
    if d.get("prefetch_factor"):
        s += f" pf={d['prefetch_factor']}"
    if d.get("persistent_workers"):
        s += " persist"
    return s + f" {d.get('precision')}"


# --- GPU-only comparisons ----------------------------------------------------------------------------

def full_epoch_survives(batch_size: int, device: str) -> dict:
    """One full epoch of the real DataLoader at `batch_size` (what a finder's answer must survive)."""
    import torch

    from gpuwise.measuring.oom import is_oom
    from gpuwise.step import StepConfig, TrainStep
    from gpuwise.tuning.trials import make_loader
    from gpuwise.workload import load_workload

    wl = load_workload(WORKLOAD)
    start = time.perf_counter()
    try:
        step = TrainStep(wl, StepConfig(), device)
        loader = make_loader(wl.build_dataset(), min(batch_size, len(wl.build_dataset())), num_workers=4,
                             pin_memory=True)
        n = 0
        for x, y in loader:
            step.step(step.to_device((x, y), non_blocking=True), on_device=True)
            n += x.shape[0]
        torch.cuda.synchronize()
        return {"survives": True, "samples": n, "seconds": time.perf_counter() - start}
    except Exception as exc:  # noqa: BLE001 - an OOM is the answer we are looking for
        if not is_oom(exc):
            raise
        return {"survives": False, "error": str(exc).splitlines()[0], "seconds": time.perf_counter() - start}
    finally:
        torch.cuda.empty_cache()


def accelerate_finder(device: str) -> dict:
    try:
        from accelerate.utils import find_executable_batch_size
    except ImportError as exc:
        return {"skipped": f"accelerate not installed ({exc})"}
    import torch

    from gpuwise.step import StepConfig, TrainStep
    from gpuwise.workload import load_workload

    wl = load_workload(WORKLOAD)
    tried = []
    start = time.perf_counter()

    @find_executable_batch_size(starting_batch_size=4096)
    def probe(batch_size):
        tried.append(batch_size)
        step = TrainStep(wl, StepConfig(), device)
        batch = step.to_device(wl.build_batch(batch_size))
        for _ in range(2):
            step.step(batch, on_device=True)
        torch.cuda.synchronize()
        return batch_size

    answer = probe()
    took = time.perf_counter() - start
    return {"answer": answer, "trials": tried, "seconds": took, "epoch": full_epoch_survives(answer, device)}


def lightning_finder(device: str) -> dict:
    try:
        import lightning.pytorch as pl
    except ImportError as exc:
        return {"skipped": f"lightning not installed ({exc})"}
    import torch

    from gpuwise.workload import load_workload

    wl = load_workload(WORKLOAD)

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.batch_size = 2
            self.net = wl.build_model()

        def training_step(self, batch, _):
            return wl.compute_loss(self.net, batch)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(wl.build_dataset(), batch_size=self.batch_size, num_workers=4)

    from lightning.pytorch.tuner import Tuner

    trainer = pl.Trainer(accelerator="gpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False)
    start = time.perf_counter()
    answer = Tuner(trainer).scale_batch_size(Module(), mode="power", max_trials=25)
    took = time.perf_counter() - start
    return {"answer": answer, "seconds": took, "epoch": full_epoch_survives(int(answer), device)}


# --- main ---------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    import torch

    from gpuwise.examples.imagefolder import ensure_images
    from gpuwise.tuning import tune
    from gpuwise.tuning.store import TrialStore
    from gpuwise.tuning.trials import usable_cpus
    from gpuwise.units import parse_duration

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--budget", default="5m")
    ap.add_argument("--measure", default="1s", help="timed part of every trial (tuner and grid alike)")
    ap.add_argument("--grid-batches", default="16,32,64,128,256,512")
    ap.add_argument("--max-workers", type=int, default=None, help="grid workers 0..N (default 2 x CPUs, <= 8)")
    ap.add_argument("--confirm", type=int, default=3, help="interleaved re-measurements of the finalists")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    device, dtype = args.device, args.device.split(":")[0]
    budget_s, measure_s = parse_duration(args.budget), parse_duration(args.measure)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"tune_imagefolder-{dtype}")
    cpus = usable_cpus()
    max_w = args.max_workers if args.max_workers is not None else min(2 * cpus, 8)
    ensure_images()  # generated once, outside every timing
    print(f"# {WORKLOAD} on {device}: {cpus} usable CPUs, os.cpu_count()={os.cpu_count()}, "
          f"load average {os.getloadavg()[0]:.1f} (shared machine: other jobs add noise)", file=sys.stderr)

    # 1. the tuner, from scratch
    tune_file = stem + "-tune.jsonl"
    if os.path.exists(tune_file):
        os.remove(tune_file)
    t0 = time.monotonic()
    result = tune(WORKLOAD, budget_s=budget_s, device=device, results=tune_file, measure_s=measure_s,
                  max_workers=max_w)
    tune_wall_s = time.monotonic() - t0
    tuned = result.to_dict()  # best, baseline, trials as in `gpuwise tune --json`
    tune_trials_s = sum(t["seconds"] for t in tuned["trials"])
    print(f"tune: {len(result.trials)} trials, {tune_wall_s:.0f}s -> {fmt(tuned['best'])} "
          f"{tuned['best']['samples_per_s'] or 0:.0f}/s", file=sys.stderr)

    # 2. the grid (resumable: a killed benchmark keeps its finished points)
    precisions = [p for p, d in result.precisions.items() if "skipped" not in d] or ["fp32"]
    points = grid_points(dtype, [int(b) for b in args.grid_batches.split(",")], max_w, precisions)
    store = TrialStore(stem + "-grid.jsonl")
    grid = []
    for i, p in enumerate(points):
        rec = run_point(p, device, measure_s, store)
        grid.append(rec)
        print(f"grid {i + 1}/{len(points)} {fmt(p)}: {rec.get('samples_per_s') or 0:.0f}/s ({rec['status']})",
              file=sys.stderr)
    ok = [r for r in grid if r["status"] == "ok"]
    grid_best = max(ok, key=lambda r: r["samples_per_s"])
    grid_s = sum(r["seconds"] for r in grid)

    # 3. confirmation, interleaved
    finalists = {"defaults": settings_of(tuned['baseline']), "tuned": settings_of(tuned['best']),
                 "grid best": settings_of(grid_best)}
    confirm = {name: [] for name in finalists}
    for _ in range(args.confirm):
        for name, s in finalists.items():
            rec = run_point(s, device, measure_s, None)
            confirm[name].append(rec.get("samples_per_s") or 0.0)
    med = {name: statistics.median(v) for name, v in confirm.items()}

    rows = [("defaults (as given)", finalists["defaults"], tuned['baseline']["samples_per_s"]),
            ("gpuwise tune", finalists["tuned"], tuned['best']["samples_per_s"]),
            ("grid best", finalists["grid best"], grid_best["samples_per_s"])]
    print(f"\n{WORKLOAD} on {device} ({cpus} CPUs, shared), trial measure {measure_s:g}s\n")
    print(f"| {'config':<20} | {'settings':<34} | {'search samples/s':>16} | {'confirmed median':>16} | {'vs defaults':>11} |")
    print(f"|{'-' * 22}|{'-' * 36}|{'-' * 18}|{'-' * 18}|{'-' * 13}|")
    for (name, s, rate), key in zip(rows, finalists):
        print(f"| {name:<20} | {fmt(s):<34} | {rate or 0:>16.0f} | {med[key]:>16.0f} | {med[key] / med['defaults']:>10.2f}x |")
    frac_best = med["tuned"] / med["grid best"] if med["grid best"] else None
    frac_time = tune_wall_s / grid_s  # the tuner's whole wall time against the grid's trial time
    print(f"\ntuned / grid best (confirmed medians): {frac_best:.3f}   (single-shot: "
          f"{(tuned['best']['samples_per_s'] or 0) / grid_best['samples_per_s']:.3f})   goal >= 0.97")
    print(f"tune time / grid time: {tune_wall_s:.0f}s / {grid_s:.0f}s = {frac_time:.3f}   "
          f"({len(result.trials)} vs {len(points)} trials; tune trials alone {tune_trials_s:.0f}s)   goal <= 0.15")
    print(f"compute-only limit at the tuned batch: {result.limit_samples_per_s or 0:.0f}/s; "
          f"tuned / limit = {(tuned['best']['samples_per_s'] or 0) / (result.limit_samples_per_s or 1):.2f}")

    gpu = {}
    if dtype == "cuda":
        gpu["tuned_fraction_of_limit"] = (tuned['best']["samples_per_s"] or 0) / (result.limit_samples_per_s or 1)
        gpu["largest_safe_batch_size"] = result.largest_safe_batch_size
        gpu["accelerate"] = accelerate_finder(device)
        gpu["lightning"] = lightning_finder(device)
        print(f"\nGPU: tuned / compute-only limit = {gpu['tuned_fraction_of_limit']:.2f} (goal >= 0.9)")
        for name in ("accelerate", "lightning"):
            print(f"{name}: {json.dumps(gpu[name], default=str)}")
    else:
        gpu["skipped"] = "no CUDA: Lightning/accelerate finder comparison and fraction of the GPU limit not run"
        print(f"\n{gpu['skipped']}")

    out = {"workload": WORKLOAD, "device": device, "cpus": cpus, "measure_s": measure_s, "budget_s": budget_s,
           "tune": result.to_dict(), "tune_trials_s": tune_trials_s, "tune_wall_s": tune_wall_s,
           "grid": grid, "grid_s": grid_s, "grid_points": len(points), "confirm": confirm,
           "confirm_median": med, "tuned_over_grid_best": frac_best, "tune_time_over_grid_time": frac_time,
           "gpu": gpu, "torch": torch.__version__, "load_average_end": os.getloadavg()}
    with open(stem + ".json", "w") as f:
        json.dump(out, f, indent=1, default=str)
    print(f"\nresults: {stem}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
