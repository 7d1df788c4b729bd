"""Estimate vs GPU truth: recompute every record of benchmarks/truth/*.jsonl on the CPU and print the errors.

    python benchmarks/truth_errors.py            # table on stdout, full rows in benchmarks/results/truth_errors.json

The records are measured on a real GPU (`gpuwise measure`, docs/contracts.md "GPU truth records"); the targets
(tests/test_plan_truth.py) are: peak allocated median |error| <= 1.5%, max <= 4%; device used (nvidia-smi)
median <= 3%, max <= 6%.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gpuwise.plan import estimate, lookup_gpu  # noqa: E402
from gpuwise.plan.against_truth import truth_errors  # noqa: E402
from gpuwise.truth import read_records, record_workload  # noqa: E402

TARGETS = {"peak_allocated_err_pct": (1.5, 4.0), "device_used_err_pct": (3.0, 6.0)}


def summarize(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Median and max |error|, with the sign: the signed median and the worst under- and over-estimate."""
    out = {}
    for key in ("peak_allocated_err_pct", "peak_reserved_err_pct", "device_used_err_pct"):
        vals = [r[key] for r in rows if r[key] is not None and not r["oom"]]
        if vals:
            out[key] = {"median_abs": round(statistics.median(map(abs, vals)), 3),
                        "max_abs": round(max(map(abs, vals)), 3), "median": round(statistics.median(vals), 3),
                        "most_under": round(min(vals), 3), "most_over": round(max(vals), 3), "n": len(vals)}
    ratios = [r["measured_step_s"] / r["roofline_step_s"] for r in rows
              if r.get("measured_step_s") and r.get("roofline_step_s") and not r["oom"]]
    if ratios:  # how far real steps are from the roofline bound (1.0 = at the bound)
        out["measured_over_roofline"] = {"median": round(statistics.median(ratios), 3),
                                         "min": round(min(ratios), 3), "max": round(max(ratios), 3), "n": len(ratios)}
    return out


def max_batch_rows(records: list[dict]) -> list[dict]:
    """For `kind: max_batch` records: the predicted largest batch with no margin on the GPU's real memory."""
    rows = []
    for r in records:
        if r.get("kind") != "max_batch" or not r.get("max_batch_size") or not r.get("gpu_memory_total_bytes"):
            continue
        spec = dataclasses.replace(lookup_gpu(r["gpu_name"]), memory_bytes=int(r["gpu_memory_total_bytes"]))
        est = estimate(record_workload(r), int(r["max_batch_size"]), optimizer=r.get("optimizer"),
                       precision=r.get("precision", "fp32"), gpu=spec, margin_pct=0.0)
        true_b = int(r["max_batch_size"])
        rows.append({"workload": r["workload"], "true_max_batch": true_b, "capped": r.get("max_batch_capped"),
                     "predicted_max_batch": est.max_batch_size,
                     "err_pct": round(100 * (est.max_batch_size - true_b) / true_b, 2)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description="estimate vs GPU truth records")
    ap.add_argument("--truth", default=str(ROOT / "benchmarks" / "truth"), help="folder of <gpu-slug>.jsonl")
    ap.add_argument("--no-max-batch", action="store_true", help="skip the largest-batch comparison (slow)")
    args = ap.parse_args()
    records = read_records(args.truth, root=ROOT)
    if not records:
        print("no truth records in benchmarks/truth/ yet: measure on a GPU first (see docs/contracts.md 'GPU truth records')")
        return 0
    # a max-batch record where not even batch 1 ran has no batch size: nothing to recompute
    rows = [truth_errors(r) for r in records if r.get("batch_size")]
    print(f"{'workload':28} {'batch':>6} {'opt':>8} {'prec':>6} {'alloc err':>10} {'reserved err':>13} "
          f"{'device err':>11} {'oom':>4} {'fits?':>6}")
    for r in rows:
        def f(v):
            return "-" if v is None else f"{v:+.2f}%"
        print(f"{r['workload']:28} {r['batch_size']:>6} {str(r['optimizer']):>8} {str(r['precision']):>6} "
              f"{f(r['peak_allocated_err_pct']):>10} {f(r['peak_reserved_err_pct']):>13} {f(r['device_used_err_pct']):>11} "
              f"{'yes' if r['oom'] else '':>4} {str(r['predicted_fits']):>6}")
    summary = summarize(rows)
    mb_rows = [] if args.no_max_batch else max_batch_rows(records)
    if mb_rows:
        print(f"\n{'workload':28} {'true max batch':>15} {'predicted (0% margin)':>22} {'err':>8}")
        for m in mb_rows:
            print(f"{m['workload']:28} {m['true_max_batch']:>15} {m['predicted_max_batch']:>22} {m['err_pct']:>+7.2f}%")
    print()
    for key, s in summary.items():
        if key == "measured_over_roofline":
            print(f"{key:24} median {s['median']:.2f}x  min {s['min']:.2f}x  max {s['max']:.2f}x  n={s['n']}"
                  "  (measured step time / roofline bound)")
            continue
        target = TARGETS.get(key)
        goal = f"  (target median <= {target[0]}%, max <= {target[1]}%)" if target else ""
        print(f"{key:24} median |err| {s['median_abs']:.2f}%  max |err| {s['max_abs']:.2f}%  signed median "
              f"{s['median']:+.2f}%  most under {s['most_under']:+.2f}%  most over {s['most_over']:+.2f}%  n={s['n']}{goal}")
    differ = Counter((lib, v["measured"], v["traced"]) for r in rows for lib, v in r["versions_differ"].items())
    for (lib, measured, traced), n in sorted(differ.items()):
        print(f"{n} records measured under {lib} {measured}, recomputed under {traced or 'none'}: where its model "
              "code changed between them, the recompute traces another program")
    out = ROOT / "benchmarks" / "results" / "truth_errors.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "summary": summary, "max_batch": mb_rows}, indent=1))
    print(f"\nfull results: {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
