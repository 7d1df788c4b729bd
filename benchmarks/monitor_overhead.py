"""How much does `gpuwise.monitor` slow a training loop? Goal: <= 0.5% of step time.

    python benchmarks/monitor_overhead.py [--reps 9] [--steps 200]

A small CPU training loop (an MLP, SGD, batches from a DataLoader over in-memory tensors) runs with
and without the monitor (loader wrapper + sampler thread at 10 Hz), interleaved rep by rep so that
drift on a shared machine hits both alike. Per rep: the median wall seconds and main-thread CPU seconds per step; reported: the
median over reps of the paired ratios (monitored / plain, adjacent in time), plus the monitor's bare per-step cost (an empty loop through `mon.loader`) in microseconds
and as a fraction of each loop's step, and the one-off cost of entering and leaving the monitor.
Full results: benchmarks/results/monitor_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch

import gpuwise

# name -> (hidden width, batch size): a ~1 ms step and a ~10 ms step on one CPU core
CONFIGS = {"small": (256, 64), "medium": (1024, 256)}
STEPS = {"small": 1.0, "medium": 0.5}  # fraction of --steps each config runs (the medium step is 10x longer)


def make_loop(hidden: int, batch: int, steps: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = torch.utils.data.TensorDataset(torch.randn(batch * steps, 256), torch.randint(0, 10, (batch * steps,)))
    loader = torch.utils.data.DataLoader(ds, batch_size=batch)

    def step(x, y):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return loader, step


def _timed(batches, step) -> tuple[float, float]:
    """Median wall seconds and median main-thread CPU seconds per step (loader wait included).

    Thread CPU time does not count time the OS gave to other processes, so on a shared machine it
    shows the monitor's own work in the training thread far more steadily than wall time."""
    wall, cpu = [], []
    t, c = time.perf_counter(), time.thread_time()
    for x, y in batches:
        step(x, y)
        now, cnow = time.perf_counter(), time.thread_time()
        wall.append(now - t)
        cpu.append(cnow - c)
        t, c = now, cnow
    return statistics.median(wall), statistics.median(cpu)


def run_plain(loader, step) -> tuple[float, float]:
    return _timed(loader, step)


def run_monitored(loader, step) -> tuple[float, float]:
    with gpuwise.monitor(device="cpu", interval_s=0.1) as mon:
        return _timed(mon.loader(loader), step)


def start_stop_ms(n: int = 10) -> float:
    """Entering and leaving `gpuwise.monitor` once (sampler thread start/stop, a final sample)."""
    t = time.perf_counter()
    for _ in range(n):
        with gpuwise.monitor(device="cpu"):
            pass
    return 1e3 * (time.perf_counter() - t) / n


def bare_cost_us(n: int = 20000) -> float:
    """The monitor's own per-step cost: iterate a list of ints through `mon.loader` vs directly."""
    items = list(range(n))
    t = time.perf_counter()
    for _ in items:
        pass
    plain = time.perf_counter() - t
    with gpuwise.monitor(device="cpu", sample=False) as mon:
        t = time.perf_counter()
        for _ in mon.loader(items):
            pass
        wrapped = time.perf_counter() - t
    return 1e6 * (wrapped - plain) / n


def sampler_tick_us(n: int = 100) -> float:
    """One host sample (psutil CPU, RSS, RAM; no GPU here), taken in the background every 0.5 s."""
    from gpuwise.monitoring.sampler import Sampler
    from gpuwise.monitoring.timeline import Timeline

    sampler = Sampler(Timeline())
    sampler.sample_once()
    t = time.perf_counter()
    for _ in range(n):
        sampler.sample_once(force_host=True)
    return 1e6 * (time.perf_counter() - t) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(1)
    results = {"torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
               "cpu_count": os.cpu_count(), "reps": args.reps, "steps": args.steps, "configs": {}}
    bare = statistics.median(bare_cost_us() for _ in range(5))
    results["bare_cost_us_per_step"] = bare
    print(f"{'loop':8} {'plain step':>11} {'monitored':>11} {'wall ratio':>11} {'CPU ratio':>10} {'bare cost':>10}")
    for name, (hidden, batch) in CONFIGS.items():
        loader, step = make_loop(hidden, batch, max(int(args.steps * STEPS[name]), 20))
        run_plain(loader, step)  # warm-up
        plain, monitored = [], []
        for rep in range(args.reps):
            order = (run_plain, run_monitored) if rep % 2 == 0 else (run_monitored, run_plain)
            for fn in order:
                (plain if fn is run_plain else monitored).append(fn(loader, step))
        # paired ratios: each rep's monitored run against the plain run next to it in time
        wall_ratio = statistics.median(m[0] / p[0] for p, m in zip(plain, monitored))
        cpu_ratio = statistics.median(m[1] / p[1] for p, m in zip(plain, monitored))
        p = statistics.median(x[0] for x in plain)
        m = statistics.median(x[0] for x in monitored)
        results["configs"][name] = {"hidden": hidden, "batch": batch, "plain": plain, "monitored": monitored,
                                    "plain_median_s": p, "monitored_median_s": m, "wall_ratio": wall_ratio,
                                    "cpu_ratio": cpu_ratio, "bare_cost_fraction": bare * 1e-6 / p}
        print(f"{name:8} {1e3 * p:9.3f}ms {1e3 * m:9.3f}ms {100 * (wall_ratio - 1):+10.2f}% "
              f"{100 * (cpu_ratio - 1):+9.2f}% {100 * bare * 1e-6 / p:9.3f}%")
    results["start_stop_ms"] = start_stop_ms()
    results["sampler_tick_us"] = tick = sampler_tick_us()
    print(f"monitor's own cost per step (an empty loop through mon.loader): {bare:.2f} us; "
          f"entering + leaving the monitor: {results['start_stop_ms']:.1f} ms once per run")
    print(f"sampler thread: {tick:.0f} us per host sample, every 0.5 s: {tick * 1e-6 * 2 * 100:.3f}% of one core "
          "(GPU samples, 10 Hz, need NVML: not measured here)")
    print("wall / CPU ratio = median over reps of (monitored / plain) median step wall time / main-thread CPU time; "
          "bare cost = own cost / plain step")
    out = os.path.join(os.path.dirname(__file__), "results", "monitor_overhead.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as fh:
        json.dump(results, fh, indent=1)
    print(f"full results: {out}")


if __name__ == "__main__":
    main()
