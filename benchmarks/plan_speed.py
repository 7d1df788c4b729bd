"""How long `gpuwise.estimate` takes, against one real CPU step and torch's MemTracker, and on 7B/70B configs.

    nice python benchmarks/plan_speed.py            # everything (several minutes)
    nice python benchmarks/plan_speed.py --quick    # examples:mlp and GPT-2 small only

Each measurement runs in a fresh child process (so first-call costs such as lazy imports count, as they
do for a user) and reports its wall time after `import torch` (the interpreter and torch's own import
are left out), the part of it spent importing `torch._dynamo` (torch imports it lazily on the first
optimizer step or fake-tensor op: a real step pays it too), and its peak RSS:

- `estimate`: `gpuwise.estimate(workload, batch, target="cpu")` (one trace);
- `real step`: building the model and one real CPU training step (gpuwise's TrainStep);
- `MemTracker`: torch.distributed._tools.mem_tracker.MemTracker under FakeTensorMode over a warm-up
  and a steady step (the same work a memory tracker needs for the optimizer state);
- 7B / 70B Llama configs (examples/configs): `estimate` at batch 1, seq 512, on the CUDA target
  (`blocks_reused`: the 32 / 80 blocks were rebuilt from 3- and 4-block traces, plan/tracing/repeat.py);
- `gpuwise estimate examples:mlp -b 64 --target cpu`: the whole command's wall time, interpreter included.

The load average is recorded before and after: the numbers are only comparable on an idle machine.

Results: benchmarks/results/plan_speed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results", "plan_speed.json")
GPT2_SMALL = os.path.join(ROOT, "tests", "workloads", "hf_gpt2_small.py")

CHILD = r"""
import json, resource, sys, time
import torch
kind, spec, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
start = time.perf_counter()
import torch._dynamo
dynamo_s = time.perf_counter() - start
if kind == "estimate":
    from gpuwise.plan import estimate
    est = estimate(spec, batch, target=sys.argv[4], search_max_batch=False)
    extra = {"peak_bytes": est.peak_allocated_bytes, "method": est.method,
             "blocks_reused": any(n.startswith("repeated blocks") for n in est.notes)}
elif kind == "step":
    from gpuwise.step import StepConfig, TrainStep
    from gpuwise.workload import load_workload
    wl = load_workload(spec)
    step = TrainStep(wl, StepConfig(), "cpu")
    step.step(wl.build_batch(batch))
    extra = {}
else:
    from gpuwise.workload import load_workload
    from memtracker_run import memtracker_step
    memtracker_step(load_workload(spec), batch)
    extra = {}
seconds = time.perf_counter() - start
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print("@@" + json.dumps({"seconds": seconds, "dynamo_import_s": dynamo_s, "peak_rss_bytes": rss, **extra}))
"""


def best(fn, repeat: int) -> dict:
    """The fastest of `repeat` runs (a shared machine's stalls only ever add time), with all the times."""
    runs = [fn() for _ in range(repeat)]
    ok = [r for r in runs if "seconds" in r]
    if not ok:
        return runs[-1]
    out = dict(min(ok, key=lambda r: r["seconds"]))
    out["all_seconds"] = [round(r["seconds"], 3) for r in ok]
    return out


def run(kind: str, spec: str, batch: int, target: str = "cpu", timeout: float = 900) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), HERE, os.environ.get("PYTHONPATH", "")]))
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, kind, spec, str(batch), target], capture_output=True,
                              text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f}s"}
    for line in proc.stdout.splitlines():
        if line.startswith("@@"):
            return json.loads(line[2:])
    return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]}


def cli_wall(timeout: float = 300) -> dict:
    """`gpuwise estimate examples:mlp -b 64 --target cpu --json` end to end (interpreter, imports, output)."""
    import time

    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "gpuwise", "estimate", "examples:mlp", "-b", "64", "--target", "cpu",
                           "--json"], capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    return {"seconds": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="examples:mlp and GPT-2 small only")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each quick measurement (the fastest kept; "
                    "GPT-2's real step and MemTracker run once, the 7B/70B configs twice)")
    ap.add_argument("--configs-only", action="store_true",
                    help="only the 7B/70B configs, replacing their rows in the recorded results")
    args = ap.parse_args(argv)
    rows = []
    load_before = os.getloadavg()
    if args.configs_only and os.path.exists(RESULTS):
        rows = [r for r in json.load(open(RESULTS))["rows"] if "real_step" in r]
    for label, spec, batch in () if args.configs_only else (
            ("examples:mlp", "examples:mlp", 64), ("GPT-2 small (124M)", GPT2_SMALL, 4)):
        n = args.repeat if spec.startswith("examples:") else 1
        est, step, mt = (best(lambda k=kind, s=spec, b=batch: run(k, s, b), n)
                         for kind in ("estimate", "step", "memtracker"))
        row = {"workload": label, "batch_size": batch, "estimate": est, "real_step": step, "memtracker": mt}
        if "seconds" in est and "seconds" in step and "seconds" in mt:
            row["estimate_vs_step"] = est["seconds"] / step["seconds"]
            row["estimate_vs_memtracker"] = est["seconds"] / mt["seconds"]
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    if not args.configs_only:
        rows.append({"workload": "CLI: gpuwise estimate examples:mlp -b 64 --target cpu", "batch_size": 64,
                     "estimate": best(cli_wall, args.repeat)})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if not args.quick:
        for label, cfg in (("Llama-2-7B config", "llama-2-7b.json"), ("Llama-2-70B config", "llama-2-70b.json")):
            est = best(lambda cfg=cfg: run("estimate", os.path.join(ROOT, "examples", "configs", cfg), 1, target="cuda"),
                       max(1, min(args.repeat, 2)))
            rows.append({"workload": label, "batch_size": 1, "estimate": est})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)

    print(f"\n{'workload':22s} {'estimate s':>11s} {'of it dynamo':>13s} {'RSS GiB':>8s} {'real step s':>12s} "
          f"{'MemTracker s':>13s} {'est/step':>9s} {'est/MT':>7s}")
    for r in rows:
        e, s, m = r["estimate"], r.get("real_step", {}), r.get("memtracker", {})

        def f(d, key="seconds", scale=1.0, fmt="{:.2f}"):
            return fmt.format(d[key] / scale) if key in d else d.get("error", "-")[:12]

        print(f"{r['workload'][:22]:22s} {f(e):>11s} {f(e, 'dynamo_import_s'):>13s} "
              f"{f(e, 'peak_rss_bytes', 2**30):>8s} {f(s):>12s} {f(m):>13s} "
              f"{r.get('estimate_vs_step', float('nan')):9.2f} {r.get('estimate_vs_memtracker', float('nan')):7.2f}")
    import torch

    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as fh:
        json.dump({"torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
                   "threads": torch.get_num_threads(), "cores": os.cpu_count(),
                   "load_average_before": load_before, "load_average_after": os.getloadavg(), "rows": rows},
                  fh, indent=1)
    print(f"full results: {os.path.relpath(RESULTS)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
