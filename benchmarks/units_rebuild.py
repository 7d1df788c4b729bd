"""Blocks of several kinds rebuilt by units (plan/tracing/alike.py `block_units`), against the step traced whole.

    nice python benchmarks/units_rebuild.py                 # the families family_sweep traced whole (families())
    python benchmarks/units_rebuild.py --types gemma2,gpt_oss
    python benchmarks/units_rebuild.py --table              # the recorded table, run nothing

A family whose blocks alternate kinds (Gemma-2's sliding and global attention, a hybrid's attention block every
fourth, dense blocks before mixture-of-experts ones) was traced whole. The rebuild now repeats a period of blocks
(a unit) after a first unit, checked by a 4-unit trace. For each family benchmarks/family_sweep.py traced whole
whose default (published-size) config has units (`block_units`), in a child process (300 s):
the step as estimate traces it (`-b 1 --seq-len 512`, bf16, AdamW, a CUDA target) and the same step traced
whole, compared:

- same: every event (sizes, categories, phases, modules, ops, pairing), the FLOPs and the peak are equal;
- same step: the steady step's events, the FLOPs and the peak are equal; set-up events come in another order
  (frees of construction temporaries; what is live at the peak is the same);
- DIFFERS: anything else (a defect);
- refused: the rebuild said why not (its 4-unit check failed, a small trace failed): traced whole, as before.

Families of alike blocks (a unit each) that family_sweep traced whole are compared too: the rebuild now also
places a storage of no block made or freed in a run over the blocks once, where it refused before.

Rows are appended to benchmarks/results/units_rebuild.jsonl as they come; the table goes to the .json beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
LIMIT_S = 300


def families() -> list[str]:
    """The families benchmarks/family_sweep.py records as traced whole, and those already recorded here (traced
    whole before units of several kinds: the sweep now records most of them as rebuilt)."""
    rows = [json.loads(line) for line in (RESULTS / "family_sweep.jsonl").read_text().splitlines()]
    mine = RESULTS / "units_rebuild.jsonl"
    recorded = {json.loads(line)["type"] for line in mine.read_text().splitlines()} if mine.exists() else set()
    return sorted({r["type"] for r in rows if r["status"] == "whole"} | recorded)


def one(model_type: str) -> dict:
    """One family's row (run in a child process)."""
    sys.path.insert(0, str(ROOT / "src"))
    from transformers import AutoConfig

    from gpuwise.hf import hf_workload, num_layers_of
    from gpuwise.plan.memory.events import live_peak
    from gpuwise.plan.tracer import quiet_libraries, trace_workload
    from gpuwise.plan.tracing.alike import block_units
    from gpuwise.plan.tracing.repeat import Units, canonical, repeated_trace
    from gpuwise.step import StepConfig

    row: dict = {"type": model_type}
    try:
        text = AutoConfig.for_model(model_type).to_json_string()
    except Exception as exc:  # noqa: BLE001 - a config class whose defaults do not validate
        return {**row, "status": "no config", "detail": f"{type(exc).__name__}"}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(text)
        try:
            wl = hf_workload(str(path), 512)
        except Exception as exc:  # noqa: BLE001
            return {**row, "status": "no config", "detail": f"{type(exc).__name__}"}
        layers = num_layers_of(wl.hf_config)
        units = block_units(wl.hf_config, wl.task, layers) if layers else "no blocks"
        if not isinstance(units, Units):
            return {**row, "status": "not by units", "detail": str(units)[:160]}
        row.update(layers=layers, first=units.first, period=units.period)
        config = StepConfig("adamw", "bf16", False)
        t = time.perf_counter()
        with quiet_libraries():
            rebuilt, why = repeated_trace(wl, 1, config, "cuda")
        row["rebuilt_s"] = round(time.perf_counter() - t, 1)
        if rebuilt is None:
            return {**row, "status": "refused", "detail": why[:160]}
        t = time.perf_counter()
        whole = trace_workload(wl, 1, config, "cuda", repeat=False)
        row["whole_s"] = round(time.perf_counter() - t, 1)
    (s1, a), (s2, b) = canonical(rebuilt), canonical(whole)
    peak = live_peak(rebuilt) == live_peak(whole)
    flops = rebuilt.flops_per_step == whole.flops_per_step
    row["peak_gib"] = round(live_peak(whole).allocated_bytes / 2**30, 2)
    if a == b and peak and flops:
        row["status"] = "same"
    elif s1 == s2 and a[s1:] == b[s2:] and Counter(a[:s1]) == Counter(b[:s2]) and peak and flops:
        row["status"] = "same step"
    else:
        row["status"] = "DIFFERS"
        row["detail"] = f"events equal {a == b}, steady equal {a[s1:] == b[s2:]}, peak {peak}, flops {flops}"
    return row


def table(rows: list[dict]) -> str:
    lines = ["| family | blocks | units (first, period) | status | rebuilt s | whole s | peak GiB | detail |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        u = f"{r['first']}, {r['period']}" if "period" in r else ""
        lines.append(f"| {r['type']} | {r.get('layers', '')} | {u} | {r['status']} | {r.get('rebuilt_s', '')} | "
                     f"{r.get('whole_s', '')} | {r.get('peak_gib', '')} | {r.get('detail', '')[:120].replace('|', '/')} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", help="comma-separated model types (default: those family_sweep traced whole)")
    ap.add_argument("--table", action="store_true", help="print the recorded table, run nothing")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one)))
        return
    from per_family import rows_by_child

    types = args.types.split(",") if args.types else families()
    done = rows_by_child(__file__, [] if args.table else types, RESULTS / "units_rebuild.jsonl", LIMIT_S, ROOT,
                         lambda t, why: {"type": t, "status": "error", "detail": why[:200]})
    rows = [done[t] for t in types if t in done and done[t]["status"] not in ("not by units", "no config")]
    counts = Counter(r["status"] for r in rows)
    summary = {"families": len(rows), "counts": dict(counts), "rows": rows}
    out = RESULTS / "units_rebuild.json"
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=1) + "\n")
    tmp.replace(out)
    print(table(rows))
    print(f"\n{dict(counts)}")


if __name__ == "__main__":
    main()
