"""DDP scaling on this machine: samples/s, efficiency, compute vs communication per step.

    python benchmarks/dist_scale.py            # GPUs when present (NCCL), else CPU ranks (gloo)
    python benchmarks/dist_scale.py --nproc 1,2,4,8 --cases gpt-mini:16

Each case is `gpuwise scale` (gpuwise.scaleout.scale.measure_scaling): one torchrun job per world size,
the per-rank batch held constant, medians of alternating synced / no_sync steps. The same model at a
small and a large per-rank batch shows the allreduce being amortised by more compute per step.
Full results go to benchmarks/results/dist_scale-<device>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch

from gpuwise.scaleout.scale import ScaleConfig, measure_scaling

DEFAULT_CASES = "mlp:8,mlp:2048,lenet:64"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", default="1,2", help="world sizes (default 1,2)")
    p.add_argument("--cases", default=DEFAULT_CASES, help=f"EXAMPLE:PER_RANK_BATCH,... (default {DEFAULT_CASES})")
    p.add_argument("--steps", type=int, default=10, help="timed steps of each kind (default 10)")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    args = p.parse_args()
    sizes = [int(n) for n in args.nproc.split(",")]
    rows, results = [], []
    for case in args.cases.split(","):
        name, batch = case.split(":")
        cfg = ScaleConfig(workload=f"examples:{name}", batch_size=int(batch), steps=args.steps, warmup=3,
                          optimizer="sgd")
        t0 = time.perf_counter()
        res = measure_scaling(cfg, sizes, device=args.device)
        print(f"  {case}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        results.append(res.to_dict())
        for pt in res.points:
            rows.append((name, batch, pt.nproc, pt.samples_per_s, pt.samples_per_s / res.points[0].samples_per_s,
                         pt.efficiency, pt.compute_s * 1e3, pt.communication_s * 1e3, pt.communication_fraction,
                         pt.gradient_bytes / 2**20, res.device, res.backend))
    header = ("workload", "batch/rank", "ranks", "samples/s", "speedup", "efficiency", "compute ms", "comm ms",
              "comm %", "grad MiB", "device", "backend")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:,.0f} | {r[4]:.2f}x | {r[5]:.0%} | {r[6]:.2f} | {r[7]:.2f} | "
              f"{r[8]:.0%} | {r[9]:.3f} | {r[10]} | {r[11]} |")
    device = results[0]["device"] if results else "none"
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    path = os.path.join(os.path.dirname(__file__), "results", f"dist_scale-{device}.json")
    with open(path, "w") as fh:
        json.dump({"torch": torch.__version__, "host_cpus": os.cpu_count(), "platform": platform.platform(),
                   "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                   "nproc": sizes, "results": results}, fh, indent=1)
    print(f"results: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
