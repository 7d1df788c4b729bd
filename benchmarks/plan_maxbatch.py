"""The planner's largest batch on a GPU: how far each prediction is from the settled answer, how many traces
settle it, and how long it takes.

    nice python benchmarks/plan_maxbatch.py            # every case (about 8 minutes on a loaded 2-core machine)
    nice python benchmarks/plan_maxbatch.py --quick    # the four small workloads only

For each (workload, GPU, precision) it runs `gpuwise.estimate(..., gpu=GPU)` (target cuda, AdamW unless
the workload names its optimizer, 5 % margin) and reports, against the settled answer b (a trace of b fits,
a trace of b + 1 does not; plan/capacity.py):

- `line`: one line through device memory at the first two traced batches (the model before piecewise);
- `piecewise`: each phase's peak its own line through the same two traces, the max of them;
- `replay`: the crossing among allocator replays of traces interpolated event by event (plan/memory/synth.py);
- `traces`: traces the search ran beyond the asked batch's own (the second batch, then what settles it);
  `replays`: allocator replays; `wall s`: the whole estimate, asked batch included.

Errors are (predicted - b) / b in percent. Results: benchmarks/results/plan_maxbatch.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results", "plan_maxbatch.json")
W = os.path.join(ROOT, "tests", "workloads")
LLAMA_1B = os.path.join(ROOT, "examples", "configs", "llama-3.2-1b.json")
LLAMA_7B = os.path.join(ROOT, "examples", "configs", "llama-2-7b.json")

# (label, workload, asked batch, GPU, precision, extra estimate kwargs)
QUICK = [
    ("wide MLP (AdamW)", os.path.join(W, "wide_mlp.py"), 8, "t4", "fp32", {}),
    ("wide MLP (AdamW)", os.path.join(W, "wide_mlp.py"), 8, "rtx-4090", "fp32", {}),
    ("small conv net", os.path.join(W, "small_conv.py"), 8, "t4", "fp32", {}),
    ("small conv net", os.path.join(W, "small_conv.py"), 8, "a100-40gb", "fp32", {}),
    ("examples:resnet", "examples:resnet", 8, "t4", "fp32", {}),
    ("examples:resnet", "examples:resnet", 8, "h100-sxm", "fp32", {}),
    ("examples:gpt-mini", "examples:gpt-mini", 4, "t4", "fp32", {}),
    ("examples:gpt-mini", "examples:gpt-mini", 4, "h100-sxm", "bf16", {}),
]
FULL = QUICK + [
    ("GPT-2 small, 256 tok", os.path.join(W, "hf_gpt2_small.py"), 4, "rtx-4090", "fp32", {}),
    ("GPT-2 small, 256 tok", os.path.join(W, "hf_gpt2_small.py"), 4, "h100-sxm", "bf16", {}),
    ("Llama-3.2-1B, 512 tok", LLAMA_1B, 1, "rtx-4090", "bf16", {"seq_len": 512}),
    ("Llama-3.2-1B, 512 tok", LLAMA_1B, 1, "h100-sxm", "bf16", {"seq_len": 512}),
    ("Llama-2-7B LoRA, 512 tok", LLAMA_7B, 1, "h100-sxm", "bf16", {"seq_len": 512, "lora": 16}),
]


def run(case) -> dict:
    from gpuwise.plan import estimate

    label, spec, batch, gpu, precision, kw = case
    start = time.perf_counter()
    est = estimate(spec, batch, precision=precision, target="cuda", gpu=gpu, **kw)
    wall = time.perf_counter() - start
    c = est.capacity
    return {"workload": label, "gpu": gpu, "precision": precision, "asked_batch": batch,
            "max_batch_size": c.max_batch_size, "settled": c.settled, "capped": c.capped,
            "peak_phase_asked": est.peak_phase, "peak_phase_answer": c.peak_phase,
            "line_max_batch_size": c.line_max_batch_size, "line_error_pct": c.line_error_pct,
            "predicted_max_batch_size": c.predicted_max_batch_size, "prediction_error_pct": c.prediction_error_pct,
            "replay_predicted_max_batch_size": c.replay_predicted_max_batch_size,
            "replay_prediction_error_pct": c.replay_prediction_error_pct,
            "traces": c.traces, "max_traces": c.max_traces, "replays": c.replays,
            "traced_order": [p.batch_size for p in c.points], "wall_s": round(wall, 2)}


def pct(v) -> str:
    return "-" if v is None else f"{v:+.1f}%"


def table(rows: list[dict]) -> str:
    head = (f"{'workload':24s} {'gpu':10s} {'prec':5s} {'b (settled)':>11s} {'peak: asked -> b':18s} "
            f"{'line':>8s} {'piecewise':>9s} {'replay':>7s} {'traces':>6s} {'replays':>7s} {'wall s':>7s}")
    out = [head]
    for r in rows:
        b = f"{r['max_batch_size']}" + ("" if r["settled"] else "?") + (" cap" if r["capped"] else "")
        out.append(f"{r['workload']:24s} {r['gpu']:10s} {r['precision']:5s} {b:>11s} "
                   f"{r['peak_phase_asked'] + ' -> ' + r['peak_phase_answer']:18s} {pct(r['line_error_pct']):>8s} "
                   f"{pct(r['prediction_error_pct']):>9s} {pct(r['replay_prediction_error_pct']):>7s} "
                   f"{r['traces']:>6d} {r['replays']:>7d} {r['wall_s']:>7.1f}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the small workloads only")
    args = ap.parse_args()
    rows = []
    for case in QUICK if args.quick else FULL:
        rows.append(run(case))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(table(rows))
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as fh:
        json.dump({"command": "nice python benchmarks/plan_maxbatch.py" + (" --quick" if args.quick else ""),
                   "machine": platform.platform(), "cpus": os.cpu_count(), "load_avg_at_end": os.getloadavg(),
                   "rows": rows, "table": table(rows).splitlines()}, fh, indent=1)
        fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
