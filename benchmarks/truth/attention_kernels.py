"""Which attention kernel a GPU really runs for each truth workload, against the one the estimate assumes.

    python benchmarks/truth/attention_kernels.py                 # on a GPU (~1 min): one step per workload/precision
    python benchmarks/truth/attention_kernels.py --compare FILE  # on any machine: the estimate's kernels beside them

On the GPU each attention workload of the truth corpus runs two training steps (AdamW, its smallest grid batch, fp32
and bf16) while `collect.sdpa_kernels_counted` asks torch's dispatcher which kernel each SDPA call gets
(`torch._fused_sdp_choice`); one JSON line per step is appended to `--out` (default
benchmarks/truth/kernels/<gpu>-attention.jsonl). `--compare` recomputes each line's estimate on the CPU for that
GPU and prints the kernels side by side (plan/tracing/sdpa.py names flash / efficient / math; torch's SDPBackend
adds cudnn_attention, which the estimate does not model).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(HERE))

import collect  # noqa: E402

from gpuwise.jsonl import append_line  # noqa: E402

WORKLOADS = [w for w in collect.GRID if any(n in w for n in ("gpt", "bert", "llama", "decoder", "t5", "vit"))]
NAMES = {"flash": "flash_attention", "efficient": "efficient_attention", "math": "math"}


def measure(device: str, out: Path, only: str | None) -> int:
    from gpuwise.measuring.runner import measure_here

    env = collect.device_environment(device)
    for workload in WORKLOADS:
        if only and only not in workload:
            continue
        for precision in ("fp32", "bf16"):
            batch = collect.GRID[workload][0]
            with collect.sdpa_kernels_counted() as kernels:
                measure_here(workload, batch, optimizer="adamw", precision=precision, device=device, steps=1,
                             warmup=1, cpu_peak=False)
            row = {"workload": workload, "batch_size": batch, "optimizer": "adamw", "precision": precision,
                   "sdpa_kernels": {k: n / 2 for k, n in sorted(kernels.items())},  # calls a step (2 steps)
                   **{k: env.get(k) for k in ("gpu_name", "torch", "cuda", "driver", "transformers")}}
            append_line(out, row)
            print(f"{workload} {precision}: {row['sdpa_kernels'] or 'no SDPA call'}", flush=True)
    return 0


def compare(path: Path) -> int:
    from gpuwise.plan import estimate
    from gpuwise.truth import record_workload

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    same = 0
    for r in rows:
        est = estimate(record_workload({**r, "_root": str(ROOT)}), r["batch_size"], optimizer=r["optimizer"],
                       precision=r["precision"], target="cuda", gpu=r["gpu_name"], search_max_batch=False)
        predicted = sorted(NAMES.get(k, k) for k in (est.attention or {}).get("kernels", []))
        measured = sorted(r["sdpa_kernels"])
        same += predicted == measured
        print(f"{r['workload']:44} {r['precision']:5} measured {', '.join(measured) or '-':32} "
              f"estimated {', '.join(predicted) or '-'}")
    print(f"{same} of {len(rows)} steps: the same kernels")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, help="default benchmarks/truth/kernels/<gpu-slug>-attention.jsonl")
    ap.add_argument("--only", help="only workloads whose path contains this")
    ap.add_argument("--compare", type=Path, help="a file this script wrote: the estimate's kernels beside its")
    a = ap.parse_args(argv)
    if a.compare:
        return compare(a.compare)
    out = a.out
    if out is None:
        import torch

        from gpuwise.plan.catalog import gpu_slug

        out = HERE / "kernels" / f"{gpu_slug(torch.cuda.get_device_name(0))}-attention.jsonl"
    return measure(a.device, out, a.only)


if __name__ == "__main__":
    sys.exit(main())
