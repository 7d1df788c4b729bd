"""How much does `gpuwise.monitor` slow a training loop? Goal: <= 0.5% of step time.

    python benchmarks/monitor_overhead.py [--reps 9] [--steps 200]

A small CPU training loop (an MLP, SGD, batches from a DataLoader over in-memory tensors) runs with
and without the monitor (loader wrapper + sampler thread at 10 Hz), interleaved rep by rep so that
drift on a shared machine hits both alike. Per rep: the median seconds per step; reported: medians over reps and
their ratio, plus the monitor's bare per-step cost (an empty loop through `mon.loader`) in microseconds
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


def run_plain(loader, step) -> float:
    """Median seconds per step (loader wait included), timed the same way in both variants."""
    times = []
    t = time.perf_counter()
    for x, y in loader:
        step(x, y)
        now = time.perf_counter()
        times.append(now - t)
        t = now
    return statistics.median(times)


def run_monitored(loader, step) -> float:
    times = []
    with gpuwise.monitor(device="cpu", interval_s=0.1) as mon:
        t = time.perf_counter()
        for x, y in mon.loader(loader):
            step(x, y)
            now = time.perf_counter()
            times.append(now - t)
            t = now
    return statistics.median(times)


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
    """One sampler tick (psutil CPU, RSS, RAM; no GPU here), run in the background every interval."""
    from gpuwise.monitor.sampler import Sampler
    from gpuwise.monitor.timeline import Timeline

    sampler = Sampler(Timeline())
    sampler.sample_once()
    t = time.perf_counter()
    for _ in range(n):
        sampler.sample_once()
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
    print(f"{'loop':8} {'plain step':>12} {'monitored':>12} {'ratio':>8} {'measured':>9} {'bare cost':>10}")
    for name, (hidden, batch) in CONFIGS.items():
        loader, step = make_loop(hidden, batch, max(int(args.steps * STEPS[name]), 20))
        run_plain(loader, step)  # warm-up
        plain, monitored = [], []
        for rep in range(args.reps):
            order = (run_plain, run_monitored) if rep % 2 == 0 else (run_monitored, run_plain)
            for fn in order:
                (plain if fn is run_plain else monitored).append(fn(loader, step))
        p, m = statistics.median(plain), statistics.median(monitored)
        results["configs"][name] = {"hidden": hidden, "batch": batch, "plain_step_s": plain, "monitored_step_s": monitored,
                                    "plain_median_s": p, "monitored_median_s": m, "ratio": m / p,
                                    "bare_cost_fraction": bare * 1e-6 / p}
        print(f"{name:8} {1e3 * p:10.3f}ms {1e3 * m:10.3f}ms {m / p:8.4f} {100 * (m / p - 1):+8.2f}% "
              f"{100 * bare * 1e-6 / p:9.3f}%")
    results["start_stop_ms"] = start_stop_ms()
    results["sampler_tick_us"] = tick = sampler_tick_us()
    print(f"monitor's own cost per step (an empty loop through mon.loader): {bare:.2f} us; "
          f"entering + leaving the monitor: {results['start_stop_ms']:.1f} ms once per run")
    print(f"sampler thread: {tick:.0f} us per tick, at 10 Hz {tick * 1e-6 * 10 * 100:.2f}% of one core")
    print("measured = ratio of median step times (noise on a shared machine is about +-2%); "
          "bare cost = own cost / plain step")
    out = os.path.join(os.path.dirname(__file__), "results", "monitor_overhead.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as fh:
        json.dump(results, fh, indent=1)
    print(f"full results: {out}")


if __name__ == "__main__":
    main()
