"""Which steps `gpuwise fit --gpu all` traces, and how many of them its answers need (issue 20's census).

    python benchmarks/fit_census.py                                  # examples/configs/llama-2-7b.json, every GPU
    python benchmarks/fit_census.py examples/configs/qwen2.5-7b.json --margin-pct 10

Runs `fit_all_gpus` in this process and groups every GPU's searches by the step they trace: the variant's step
config and training modes (offload is a transform of a trace and accumulation traces min(N, 2) micro-steps, so
neither makes another step), at each micro-batch. Attention classes are not told apart: GPUs whose SDPA calls
run the same kernels share a trace (`same_kernels`; for Llama-2's 128-wide heads every sm80+ GPU does), the
evaluator's own `traces_run` is printed beside the count to show where they do not. Per step it prints the
micro-batches the searches traced, each GPU's trials (micro-batch, fits, % over or under the usable bytes) and
answer, and two lower bounds on the micro-batches any search keeping today's answers must trace:

- `rule`: every answer (its bytes are the option's), and for an answer that fits below the whole batch the next
  larger divisor (the rule "the answer fits, the next larger divisor is traced and does not");
- `synth`: the same, but a failing neighbour over the usable bytes by more than `--margin-pct` is counted as
  synthesized (plan/memory/synth.py) rather than traced. Both are lower bounds: a search must still find the
  answer, and a synthesized trial needs two traced micro-batches of the same step around it.

Writes one JSON line per run to benchmarks/results/fit_census.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from gpuwise.plan.catalog import CATALOG
from gpuwise.plan.curve import DEFAULT_MARGIN_PCT
from gpuwise.plan.fit import batch_divisors
from gpuwise.plan.fit_gpus import fit_all_gpus
from gpuwise.plan.fit_options import variants

ROOT = Path(__file__).resolve().parent.parent


def census(workload: str, batch: int, margin_pct: float) -> dict:
    t, cpu = time.perf_counter(), time.process_time()
    results = fit_all_gpus(workload, 1, batch)
    wall_s, cpu_s = time.perf_counter() - t, time.process_time() - cpu  # cpu: this process only, not its forks
    specs = {s.name: s for s in CATALOG.values() if s.listed}
    steps: dict[str, dict] = defaultdict(lambda: {"gpus": {}, "traced": set(), "rule": set(), "synth": set()})
    for r in results:
        spec = specs[r.gpu]
        by_name = {v.name: v for v in variants(spec, 1, "fp32", None, False)}
        limit = r.gpu_memory_bytes * (1 - DEFAULT_MARGIN_PCT / 100)  # fit's usable bytes
        for o in r.options:
            if not o.trials:
                continue  # floored or not sized: no trace
            v = by_name[o.name.split(" + accumulation")[0]]
            modes = replace(v.modes, offload_optimizer=False, grad_accum=1)
            step = f"{v.config.precision} {v.config.optimizer} ckpt={v.config.checkpointing} {modes}"
            s = steps[step]
            s["gpus"][spec.id] = {"trials": [(m, ok, round(100 * (b - limit) / limit, 1)) for m, ok, b in o.trials],
                                  "answer": o.micro_batch_size, "fits": o.fits}
            s["traced"] |= {m for m, _, _ in o.trials}
            need = {o.micro_batch_size}
            larger = sorted(d for d in batch_divisors(batch) if d > o.micro_batch_size)
            s["rule"] |= need | ({larger[0]} if o.fits and larger else set())
            s["synth"] |= need
            if o.fits and larger:
                over = next((b for m, _, b in o.trials if m == larger[0]), None)
                if over is None or (over - limit) / limit * 100 <= margin_pct:
                    s["synth"].add(larger[0])
    total = {k: sum(len(s[k]) for s in steps.values()) for k in ("traced", "rule", "synth")}
    return {"workload": workload, "batch": batch, "margin_pct": margin_pct, "wall_s": round(wall_s, 1),
            "parent_cpu_s": round(cpu_s, 1), "traces_run": max((r.traces for r in results), default=0),
            "steps": {k: {**v, **{f: sorted(v[f]) for f in ("traced", "rule", "synth")}} for k, v in steps.items()},
            "micro_batches": total}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload", nargs="?", default="examples/configs/llama-2-7b.json")
    ap.add_argument("-b", "--batch-size", type=int, default=8)
    ap.add_argument("--margin-pct", type=float, default=10.0, help="a failing neighbour this far over counts as synthesized")
    a = ap.parse_args()
    found = census(a.workload, a.batch_size, a.margin_pct)
    for step, s in found["steps"].items():
        print(f"{step}\n  traced {s['traced']}  rule {s['rule']}  synth {s['synth']}")
        for gpu, g in s["gpus"].items():
            print(f"    {gpu:14s} answer {g['answer']} fits={g['fits']}  trials {g['trials']}")
    print(json.dumps({k: found[k] for k in ("workload", "wall_s", "parent_cpu_s", "traces_run", "micro_batches")}))
    out = ROOT / "benchmarks" / "results" / "fit_census.jsonl"
    with out.open("a") as f:
        f.write(json.dumps({"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                            "cpus": len(os.sched_getaffinity(0)), "load": round(os.getloadavg()[0], 2), **found}) + "\n")


if __name__ == "__main__":
    main()
