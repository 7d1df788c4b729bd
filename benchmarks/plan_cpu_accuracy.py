"""The tracer's CPU target against the profiler, and its speed against MemTracker.

    python benchmarks/plan_cpu_accuracy.py            # accuracy table + GPT-2-small speed (several minutes)
    python benchmarks/plan_cpu_accuracy.py --quick    # smaller set, no GPT-2-small speed run

Accuracy: for each workload and optimizer, one steady-state training step is measured on the CPU with
PyTorch's profiler (`gpuwise.plan.tracing.cpu_truth.measure_cpu_peak`: every CPU-allocator call, from before the
model is built) and traced with fake tensors (`gpuwise.plan.tracing.trace.trace_step(target="cpu")`); the
table shows both peaks, the signed error and the trace's wall time.

Speed: a GPT-2-small step (transformers GPT2Config(): 124M parameters, batch 4, 256 tokens, AdamW)
traced by gpuwise and by `torch.distributed._tools.mem_tracker.MemTracker` under FakeTensorMode in this
same process, alternating, `--reps` times each; medians and their ratio (goal: <= 0.5).
Full results: benchmarks/results/plan_cpu_accuracy.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch
from memtracker_run import memtracker_step

from gpuwise.plan.memory.events import live_peak
from gpuwise.plan.tracing.cpu_truth import measure_cpu_peak
from gpuwise.plan.tracing.trace import trace_step
from gpuwise.step import StepConfig
from gpuwise.workload import load_workload

HERE = os.path.dirname(os.path.abspath(__file__))
WL = os.path.join(HERE, "..", "tests", "workloads")
RESULTS = os.path.join(HERE, "results", "plan_cpu_accuracy.json")

# (label, workload spec, batch size, non-default optimizer)
WORKLOADS = [
    ("GPT-2 (tiny)", os.path.join(WL, "hf_gpt2.py"), 8, "sgd"),
    ("Llama (tiny)", os.path.join(WL, "hf_llama.py"), 8, "momentum"),
    ("BERT (tiny)", os.path.join(WL, "hf_bert.py"), 8, "adagrad"),
    ("T5 (tiny)", os.path.join(WL, "hf_t5.py"), 8, "rmsprop"),
    ("ViT (tiny)", os.path.join(WL, "hf_vit.py"), 8, "sgd"),
    ("ConvNeXt (tiny)", os.path.join(WL, "hf_convnext.py"), 8, "adam"),
    ("LSTM", os.path.join(WL, "lstm.py"), 32, "sgd"),
    ("GRUCell loop", os.path.join(WL, "gru.py"), 32, "rmsprop"),
    ("data-dependent MLP", os.path.join(WL, "datadep.py"), 64, "sgd"),
    ("examples:mlp", "examples:mlp", 100, "sgd"),
    ("examples:lenet", "examples:lenet", 64, "sgd"),
    ("examples:resnet", "examples:resnet", 8, "sgd"),
    ("examples:gpt-mini", "examples:gpt-mini", 4, "sgd"),
]
QUICK = {"GPT-2 (tiny)", "BERT (tiny)", "ViT (tiny)", "LSTM", "examples:lenet", "examples:gpt-mini"}


def accuracy_rows(quick: bool) -> list[dict]:
    rows = []
    for label, spec, batch, other in WORKLOADS:
        if quick and label not in QUICK:
            continue
        for optimizer in (None, other):
            config = StepConfig(optimizer=optimizer)
            truth = measure_cpu_peak(spec, batch, config)
            start = time.perf_counter()
            trace = trace_step(spec, batch, config, target="cpu")
            seconds = time.perf_counter() - start
            peak = live_peak(trace)
            rows.append({
                "model": label, "batch_size": batch, "optimizer": optimizer or "adamw (default)",
                "profiler_peak_bytes": truth, "gpuwise_peak_bytes": peak.allocated_bytes,
                "error_pct": 100.0 * (peak.allocated_bytes - truth) / truth, "trace_s": seconds,
                "method": trace.method, "peak_at": f"{peak.phase}/{peak.op}",
            })
            r = rows[-1]
            print(f"{label:20s} {r['optimizer']:16s} {truth / 2**20:10.3f} {peak.allocated_bytes / 2**20:10.3f} "
                  f"{r['error_pct']:+8.3f}% {seconds:7.2f}s  {trace.method}", file=sys.stderr)
    return rows


def _memtracker_step(spec: str, batch_size: int) -> float:
    workload = load_workload(spec)
    start = time.perf_counter()
    memtracker_step(workload, batch_size)
    return time.perf_counter() - start


def speed(reps: int) -> dict:
    spec = os.path.join(WL, "hf_gpt2_small.py")
    trace_step(os.path.join(WL, "hf_gpt2.py"), 2)  # imports and first-call costs out of the way
    gpuwise_s, full_s, memtracker_s = [], [], []
    for _ in range(reps):
        start = time.perf_counter()
        trace_step(spec, 4, StepConfig(), target="cpu")  # default warm-up: optimizer state only
        gpuwise_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        trace_step(spec, 4, StepConfig(), target="cpu", warmup="step")  # two whole steps, as MemTracker
        full_s.append(time.perf_counter() - start)
        memtracker_s.append(_memtracker_step(spec, 4))
        print(f"gpt2-small: gpuwise {gpuwise_s[-1]:.2f}s (whole warm-up step {full_s[-1]:.2f}s)  "
              f"MemTracker {memtracker_s[-1]:.2f}s", file=sys.stderr)
    g, f, m = (statistics.median(x) for x in (gpuwise_s, full_s, memtracker_s))
    return {"workload": "GPT-2 small (124M), batch 4, 256 tokens, AdamW", "reps": reps,
            "gpuwise_s": gpuwise_s, "gpuwise_whole_warmup_s": full_s, "memtracker_s": memtracker_s,
            "gpuwise_median_s": g, "gpuwise_whole_warmup_median_s": f, "memtracker_median_s": m,
            "ratio": g / m, "ratio_whole_warmup": f / m}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer workloads, no GPT-2-small speed run")
    ap.add_argument("--reps", type=int, default=3, help="GPT-2-small timing repetitions (default 3)")
    args = ap.parse_args(argv)

    rows = accuracy_rows(args.quick)
    print(f"\n{'model':20s} {'optimizer':16s} {'profiler MiB':>12s} {'gpuwise MiB':>12s} {'error':>9s} {'trace s':>8s}")
    for r in rows:
        print(f"{r['model']:20s} {r['optimizer']:16s} {r['profiler_peak_bytes'] / 2**20:12.3f} "
              f"{r['gpuwise_peak_bytes'] / 2**20:12.3f} {r['error_pct']:+8.3f}% {r['trace_s']:8.2f}")
    errors = [abs(r["error_pct"]) for r in rows]
    within = sum(e <= 1.0 for e in errors)
    print(f"\n|error| median {statistics.median(errors):.3f}%, max {max(errors):.3f}%; "
          f"{within}/{len(rows)} within 1%")
    result = {"torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
              "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
              "accuracy": rows}
    if not args.quick:
        s = speed(args.reps)
        result["speed"] = s
        print(f"\nGPT-2 small step (median of {s['reps']}): MemTracker {s['memtracker_median_s']:.2f}s; gpuwise "
              f"{s['gpuwise_median_s']:.2f}s (ratio {s['ratio']:.2f}), with a whole warm-up step "
              f"{s['gpuwise_whole_warmup_median_s']:.2f}s (ratio {s['ratio_whole_warmup']:.2f}); goal <= 0.5")
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(result, f, indent=1)
    print(f"full results: {os.path.relpath(RESULTS)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
