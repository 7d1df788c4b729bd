"""Fit the host side of the step-time model (plan/speed/launch.py) to the GPU truth records.

    python benchmarks/fit_host.py            # the fit launch.py cites (~5 min on 2 cores)
    python benchmarks/fit_host.py --h200     # H200 records only

For each timed record of the fit workloads, the estimate is recomputed (benchmarks/truth_speed.py does the
same) and what the trace counted is kept: aten ops and convolution calls per step, the predicted GPU time
and the batch copy. A record is host-bound when it took more than twice the predicted GPU time; on those,
measured - copy - HOST_PER_OP_S x ops = HOST_STEP_S + HOST_PER_CONV_S x convolutions is fitted by least
squares on the relative error (HOST_PER_OP_S, cited, is held; `--free-op` fits it too). The other workloads'
records are the check (benchmarks/truth_speed.py).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gpuwise.plan.speed import launch  # noqa: E402
from gpuwise.truth import read_records  # noqa: E402

FIT = ("examples:mlp", "examples:lenet", "embedding.py", "/bert.py", "examples:gpt-mini", "gpt2_small.py",
       "resnet50.py")
# the published-size workloads at their smallest batch only (the larger ones are GPU-bound and slow to trace)
SMALLEST = {"gpt2_small.py": 2, "resnet50.py": 16}
HOST_BOUND = 2.0


def counted(record: dict) -> dict:
    """The record's trace counts and predicted GPU phases (the speed model's own inputs)."""
    against_truth = importlib.import_module("gpuwise.plan.against_truth")
    seen: dict = {}
    step_s, host_phases_s = launch.step_s, launch.host_phases_s

    def spy_step(gpu, host, start_s=0.0):
        seen.update(gpu=sum(gpu.values()), copy=start_s)
        return step_s(gpu, host, start_s)

    def spy_host(host_ops, conv_calls=None):
        seen.update(ops=sum(host_ops.values()), convs=sum((conv_calls or {}).values()))
        return host_phases_s(host_ops, conv_calls)

    launch.step_s, launch.host_phases_s = spy_step, spy_host
    try:
        against_truth.truth_errors(record)
    finally:
        launch.step_s, launch.host_phases_s = step_s, host_phases_s
    return seen


def main(argv: list[str] | None = None) -> int:
    import numpy as np

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--h200", action="store_true", help="the H200 records only")
    ap.add_argument("--free-op", action="store_true", help="fit HOST_PER_OP_S as well")
    args = ap.parse_args(argv)
    rows = []
    for r in read_records(ROOT / "benchmarks" / "truth", root=ROOT):
        w = r.get("workload", "")
        if not (r.get("batch_size") and r.get("step_time_s")) or r.get("oom") or not any(f in w for f in FIT):
            continue
        if any(w.endswith(k) and r["batch_size"] > b for k, b in SMALLEST.items()):
            continue
        if args.h200 and "H200" not in r.get("gpu_name", ""):
            continue
        c = counted(r)
        if c and r["step_time_s"] > HOST_BOUND * (c["gpu"] + c["copy"]):
            rows.append((r, c))
    ops = np.array([c["ops"] for _, c in rows])
    y = np.array([r["step_time_s"] - c["copy"] for r, c in rows])
    if args.free_op:
        x = np.array([[1.0, c["ops"], c["convs"]] for _, c in rows])
        coef, *_ = np.linalg.lstsq(x / y[:, None], np.ones_like(y), rcond=None)
    else:
        x = np.array([[1.0, c["convs"]] for _, c in rows])
        fixed, *_ = np.linalg.lstsq(x / y[:, None], 1 - launch.HOST_PER_OP_S * ops / y, rcond=None)
        coef = np.array([fixed[0], launch.HOST_PER_OP_S, fixed[1]])
        x = np.array([[1.0, c["ops"], c["convs"]] for _, c in rows])
    err = 100 * (x @ coef - y) / y
    names = sorted({Path(r["workload"]).stem for r, _ in rows})
    print(f"{len(rows)} host-bound records ({', '.join(names)})")
    print(f"HOST_STEP_S {coef[0] * 1e6:.1f} us  HOST_PER_OP_S {coef[1] * 1e6:.2f} us  HOST_PER_CONV_S "
          f"{coef[2] * 1e6:.1f} us  (median |err| of the fit {statistics.median(abs(err)):.1f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
