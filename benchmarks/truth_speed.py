"""Predicted step time vs the GPU truth records' measured step time (benchmarks/truth/*.jsonl).

    python benchmarks/truth_speed.py              # table on stdout, rows in benchmarks/results/truth_speed.json
    python benchmarks/truth_speed.py resnet50     # only workloads whose name contains one of the words

The records time `steps` steady steps of the bundled workloads on a real GPU (benchmarks/truth/collect.py);
each is recomputed here with `estimate` on the record's GPU (the speed model, plan/speed/) and compared.
Summary per workload and precision: median and worst signed error of the predicted step time.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gpuwise.plan.against_truth import truth_errors  # noqa: E402
from gpuwise.truth import read_records  # noqa: E402


def row(r: dict) -> dict:
    x = truth_errors(r)
    err = x["step_err_pct"]
    return {"source": x["source"], "gpu": r["gpu_name"], "workload": x["workload"], "batch_size": x["batch_size"],
            "optimizer": x["optimizer"], "precision": x["precision"], "checkpointing": bool(r.get("checkpointing")),
            "measured_step_s": x["measured_step_s"], "predicted_step_s": x["predicted_step_s"],
            "err_pct": None if err is None else round(err, 1), "bound_by": x["bound_by"],
            "breakdown_s": x["breakdown_s"]}


def main() -> int:
    words = sys.argv[1:]
    records = [r for r in read_records(ROOT / "benchmarks" / "truth", root=ROOT)
               if r.get("batch_size") and r.get("step_time_s") and not r.get("oom")
               and (not words or any(w in r["workload"] for w in words))]
    if not records:
        print("no timed truth records in benchmarks/truth/ (measured on a GPU: benchmarks/truth/collect.py)")
        return 0
    rows = []
    print(f"{'workload':22} {'batch':>6} {'opt':>8} {'prec':>5} {'measured':>10} {'predicted':>10} {'err':>7}  bound by",
          flush=True)
    for r in records:
        x = row(r)
        rows.append(x)
        pred = "-" if x["predicted_step_s"] is None else f"{x['predicted_step_s'] * 1e3:.2f} ms"
        err = "-" if x["err_pct"] is None else f"{x['err_pct']:+.1f}%"
        print(f"{Path(x['workload']).stem[:22]:22} {x['batch_size']:>6} {str(x['optimizer']):>8} {x['precision']:>5} "
              f"{x['measured_step_s'] * 1e3:>7.2f} ms {pred:>10} {err:>7}  {x['bound_by']}", flush=True)
    groups = defaultdict(list)
    for x in rows:
        if x["err_pct"] is not None:
            groups[(Path(x["workload"]).stem, x["precision"])].append(x["err_pct"])
    print(f"\n{'workload':22} {'prec':>5} {'n':>3} {'median err':>11} {'most under':>11} {'most over':>10}")
    for (w, p), errs in sorted(groups.items()):
        print(f"{w[:22]:22} {p:>5} {len(errs):>3} {statistics.median(errs):>+10.1f}% {min(errs):>+10.1f}% "
              f"{max(errs):>+9.1f}%")
    errs = [x["err_pct"] for x in rows if x["err_pct"] is not None]
    summary = {"n": len(errs), "median_abs_err_pct": statistics.median(map(abs, errs)),
               "max_abs_err_pct": max(map(abs, errs)), "signed_median_err_pct": statistics.median(errs)}
    print(f"\nall: n={summary['n']} median |err| {summary['median_abs_err_pct']:.1f}%  max |err| "
          f"{summary['max_abs_err_pct']:.1f}%  signed median {summary['signed_median_err_pct']:+.1f}%")
    if not words:
        out = ROOT / "benchmarks" / "results" / "truth_speed.json"
        out.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
        print(f"rows: {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
