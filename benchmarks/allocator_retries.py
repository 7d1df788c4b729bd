"""Does a step of llm-foundry's slowest rows need caching-allocator retries at the GPU's capacity?

    nice python benchmarks/allocator_retries.py          # the rows of benchmarks/published/README.md's analysis

Each row's step is estimated as Composer runs it for memory -- FSDP mixed_precision DEFAULT / PURE =
`--fsdp-param-dtype bf16 --fsdp-reduce-dtype fp32 / bf16` (fp32 shards, bf16 gathers and compute), a
reduce-scatter every micro-batch (`--accum-sync every`), every block checkpointed -- and its per-rank events
(+ the CUDA workspaces) replayed through the caching-allocator model (src/gpuwise/plan/memory/allocator.py)
at the GPU's capacity less what lives outside the allocator, over the warm-up and 4 steady steps replayed
one by one. A cudaMalloc that does not fit frees every unsplit cached segment and retries
(`release_cached_blocks`); the table counts those per step (warm-up, steady steps 1-4).
Investigation only: nothing here feeds the speed prediction (issue 22, step 2).
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

G = 2**30
STEADY_STEPS = 4
# (model, seq_len, micro_batch, grad_accum, gpu, gpus, reduce dtype: mixed_precision DEFAULT fp32, PURE bf16)
ROWS = [
    ("30b", 8192, 1, 21, "H100", 8, "fp32"),
    ("30b", 8192, 1, 21, "A100-80GB", 8, "fp32"),
    ("30b", 4096, 1, 21, "H100", 8, "fp32"),
    ("30b", 4096, 1, 21, "A100-80GB", 8, "fp32"),
    ("70b", 2048, 2, 1, "A100-40GB", 64, "bf16"),
    ("70b", 2048, 4, 1, "A100-40GB", 128, "bf16"),
    ("13b", 2048, 4, 16, "A100-40GB", 8, "bf16"),
    ("13b", 2048, 10, 1, "A100-40GB", 16, "bf16"),
]


def row(model: str, seq: int, micro: int, accum: int, gpu: str, gpus: int, reduce: str) -> dict:
    from gpuwise.plan import estimate
    from gpuwise.plan.memory.allocator import repeat_steady, replay
    from gpuwise.plan.memory.events import MemoryTrace
    from gpuwise.plan.memory.overheads import add_workspaces
    from gpuwise.plan.speed.attention import gpu_torch

    config = os.path.join(HERE, "published", "configs", "mpt", f"mpt-{model}-s{seq}.json")
    with gpu_torch("2.6"):
        est = estimate(config, micro, seq_len=seq, grad_accum=accum, precision="fp32", fsdp_param_dtype="bf16",
                       fsdp_reduce_dtype=reduce, gpu=gpu, nproc=gpus, strategy="fsdp",
                       accum_sync="every" if accum > 1 else None, attn="triton", checkpointing="full",
                       target="cuda", search_max_batch=False)
    with_ws, overheads = add_workspaces(est.trace, "hopper" if gpu.startswith("H100") else "ampere")
    capacity = est.gpu_memory_bytes - overheads.outside_allocator_bytes
    # retries by step: the warm-up replayed alone, then 1, 2, ... steady steps after it, each replayed in full
    warm = MemoryTrace(with_ws.events[:with_ws.steady_start], with_ws.steady_start, with_ws.device_type,
                       with_ws.method, [])
    counts = [replay(warm, capacity_bytes=capacity).retries]
    for k in range(1, STEADY_STEPS + 1):
        counts.append(replay(repeat_steady(with_ws, k), capacity_bytes=capacity).retries)
    at_capacity = replay(repeat_steady(with_ws, STEADY_STEPS), capacity_bytes=capacity, keep_timeline=True)
    steps = repeat_steady(with_ws, STEADY_STEPS)
    per_step = [counts[0]] + [b - a for a, b in zip(counts, counts[1:])]
    freed_at = []  # where reserved memory fell: cached segments freed by a retry (a retry whose new segment
    last = None    # is as large as what it freed does not show here)
    for i, _allocated, reserved in at_capacity.timeline:
        if last is not None and reserved < last:
            ev = steps.events[i]
            freed_at.append(f"{ev.phase}, {ev.op}")
        last = reserved
    oom_at = None
    if at_capacity.oom:
        ev = steps.events[at_capacity.oom_event_index]
        oom_at = f"{ev.phase}, {ev.op}, {at_capacity.oom_request_bytes / 2**20:.0f} MiB asked"
    return {"row": f"mpt-{model} s{seq} mb{micro} ga{accum} on {gpus} x {gpu}",
            "tensors_gib": est.peak_allocated_bytes / G, "reserved_unlimited_gib": est.peak_reserved_bytes / G,
            "capacity_gib": capacity / G, "retries_per_step": per_step, "oom": oom_at, "freed_at": freed_at}


def main() -> int:
    print("| row | tensors at the peak | reserved, unlimited replay | allocator capacity | at capacity |")
    print("|---|---|---|---|---|")
    for spec in ROWS:
        r = row(*spec)
        steps = ", ".join(f"{n} in {'warm-up' if i == 0 else f'steady step {i}'}"
                          for i, n in enumerate(r["retries_per_step"]) if n) or "none"
        verdict = f"OOM ({r['oom']}); retries: {steps}" if r["oom"] else f"retries: {steps}"
        if r["freed_at"]:
            verdict += "; cache freed at " + "; ".join(dict.fromkeys(r["freed_at"]))
        print(f"| {r['row']} | {r['tensors_gib']:.1f} GiB | {r['reserved_unlimited_gib']:.1f} GiB | "
              f"{r['capacity_gib']:.1f} GiB | {verdict} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
