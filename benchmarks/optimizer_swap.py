"""Is another optimizer swapped into AdamW's traced step that optimizer's own step, across model families?

    nice python benchmarks/optimizer_swap.py                       # the families below (resumes: done ones kept)
    python benchmarks/optimizer_swap.py --types llama,gpt2        # some of them
    python benchmarks/optimizer_swap.py --table                   # the recorded table, run nothing

`fit` weighs 8-bit AdamW and Adafactor by swapping their steps (traced alone on the whole model) into the step it
traced with AdamW (plan/tracing/optimizer_swap.py), where AdamW's own steps are found in it event for event. For
each transformers causal-LM family at its default (published-size) config, `-b 1 --seq-len 64 --precision bf16`
(CUDA target), this traces AdamW's step as estimate does (rebuilt from 3 and 4 blocks where it can), swaps each
optimizer in, and compares with that optimizer's step traced whole (no rebuild): the swap refused (then fit
traces the step itself), or accepted with the same device bytes (the allocator replay, hopper) and the same
events after the set-up (a rebuild may free set-up temporaries in another order). A swap accepted with other bytes would be a defect. Each family runs in a child process
(600 s limit); rows are appended to benchmarks/results/optimizer_swap.jsonl, the summary goes to the .json beside.
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
LIMIT_S = 600
OPTIMIZERS = ("adafactor", "adamw8bit")
# families the family sweep rebuilt (benchmarks/results/family_sweep.json), dense and MoE, of several lineages
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "phi", "phi3", "gpt2", "gpt_neox", "falcon", "opt",
            "starcoder2", "stablelm", "olmo2", "granite", "cohere", "mixtral", "qwen2_moe", "gptj", "mamba2",
            "codegen", "mpt", "glm4", "ministral3")


def one(model_type: str) -> dict:
    """The row of one family (run in a child process)."""
    sys.path.insert(0, str(ROOT / "src"))
    from transformers import AutoConfig

    from gpuwise.hf import hf_workload
    from gpuwise.plan.memory.cuda import cuda_memory
    from gpuwise.plan.tracer import trace_optimizer_steps, trace_workload, with_optimizer
    from gpuwise.step import StepConfig

    def shape(events):
        local: dict[int, int] = {}
        return [(e.action, local.setdefault(e.block, len(local)), e.nbytes, e.category, e.op)
                for e in events if e.phase != "setup"]

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{model_type}.json"
        path.write_text(AutoConfig.for_model(model_type).to_json_string())
        source = hf_workload(str(path), 64)
        t = time.perf_counter()
        base = trace_workload(source, 1, StepConfig("adamw", "bf16"), "cuda", True)
        row = {"type": model_type, "adamw_s": round(time.perf_counter() - t, 2),
               "adamw_rebuilt": any(n.startswith("repeated blocks: traced with") for n in base.notes)}
        t = time.perf_counter()
        own = trace_optimizer_steps(source, StepConfig("adamw", "bf16"), "cuda")
        row["own_steps_s"] = round(time.perf_counter() - t, 2)
        for name in OPTIMIZERS:
            config = StepConfig(name, "bf16")
            t = time.perf_counter()
            other = trace_optimizer_steps(source, config, "cuda")
            swapped = with_optimizer(base, own, other, name, "adamw")
            swap_s = time.perf_counter() - t
            t = time.perf_counter()
            direct = trace_workload(source, 1, config, "cuda", False)  # traced whole: the truth of the trace
            r = {"swap_s": round(swap_s, 2), "whole_s": round(time.perf_counter() - t, 2),
                 "direct_bytes": cuda_memory(direct, "hopper").device_used_bytes}
            if swapped is None:
                r["status"] = "refused"
            else:
                r["swapped_bytes"] = cuda_memory(swapped, "hopper").device_used_bytes
                same = r["swapped_bytes"] == r["direct_bytes"] and shape(swapped.events) == shape(direct.events)
                r["status"] = "same" if same else "DIFFERS"
            row[name] = r
    return row


def table(rows: list[dict]) -> str:
    lines = ["| family | AdamW rebuilt | " + " | ".join(f"{o}: swap (its s / whole s)" for o in OPTIMIZERS) + " |",
             "|---|---|" + "---|" * len(OPTIMIZERS)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['type']} | error: {r['error'][:80]} |" + " |" * len(OPTIMIZERS))
            continue
        cells = []
        for o in OPTIMIZERS:
            x = r[o]
            cells.append(f"{x['status']} ({x['swap_s'] + r['own_steps_s']:.1f} s / {x['whole_s']:.1f} s)")
        lines.append(f"| {r['type']} | {'yes' if r['adamw_rebuilt'] else 'no'} ({r['adamw_s']:.1f} s) | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", help="comma-separated model types (default: FAMILIES)")
    ap.add_argument("--table", action="store_true", help="print the recorded table, run nothing")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one)))
        return
    from per_family import rows_by_child

    types = args.types.split(",") if args.types else list(FAMILIES)
    done = rows_by_child(__file__, [] if args.table else types, RESULTS / "optimizer_swap.jsonl", LIMIT_S, ROOT,
                         lambda t, why: {"type": t, "error": why})
    rows = [done[t] for t in types if t in done]
    counts = Counter(r[o]["status"] for r in rows if "error" not in r for o in OPTIMIZERS)
    summary = {"families": len(rows), "errors": sum("error" in r for r in rows), "swaps": dict(counts),
               "rows": rows}
    (RESULTS / "optimizer_swap.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(table(rows))
    print(f"\n{dict(counts)}; {summary['errors']} families failed to trace")


if __name__ == "__main__":
    main()
