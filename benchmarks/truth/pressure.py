"""Step time under memory pressure: how much slower a training step runs when the card holds barely more
than the step's peak, measured on a real GPU (the speed model's allocator-retry question).

    python benchmarks/truth/pressure.py                     # on a GPU (~3 min): three configurations
    python benchmarks/truth/pressure.py --device cpu --quick  # the plumbing only (no cap on a CPU)

Each configuration runs in a fresh child process (PYTORCH_CUDA_ALLOC_CONF must be set before CUDA starts):
the model and AdamW on the GPU, bf16 autocast, a few unconstrained steps give the step time, peak allocated
and peak reserved; then, for caps from 1.25x down to below peak reserved, `set_per_process_memory_fraction`
limits the caching allocator to that many bytes, the cache is emptied, and timed steps record the step time,
the allocator's retries (`num_alloc_retries`: cudaFree of every cached block, then one more cudaMalloc, which
synchronises the device), cudaMalloc/cudaFree counts and OOMs. One JSON line per cap, appended atomically to
`--out` (default benchmarks/truth/kernels/<gpu>-pressure.jsonl: not a truth record).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks/truth/workloads"))

from gpuwise.jsonl import append_line  # noqa: E402

W = "benchmarks/truth/workloads/"
CONFIGS = [  # workload, batch, PYTORCH_CUDA_ALLOC_CONF
    (W + "decoder_1b.py", 8, ""),
    (W + "decoder_1b.py", 8, "expandable_segments:True"),
    (W + "gpt2_small.py", 32, ""),
]
CAPS = (1.25, 1.1, 1.05, 1.02, 1.0, 0.99, 0.98, 0.96, 0.94, 0.92, 0.9, 0.85, 0.8)


def _step(model, opt, batch, cuda):
    import torch

    with torch.autocast("cuda" if cuda else "cpu", dtype=torch.bfloat16):
        loss = model(**batch).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _timed(model, opt, batch, dev, steps):
    import torch

    cuda = dev.type == "cuda"
    times = []
    for _ in range(steps):
        if cuda:
            torch.cuda.synchronize(dev)
        t = time.perf_counter()
        _step(model, opt, batch, cuda)
        if cuda:
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t)
    return times


def child(spec: str, batch_size: int, device: str, steps: int, warmup: int, out: Path, alloc_conf: str) -> None:
    import torch

    from gpuwise.workload import load_workload

    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:  # set_per_process_memory_fraction wants an index
        dev = torch.device("cuda", torch.cuda.current_device())
    cuda = dev.type == "cuda"
    wl = load_workload(spec)
    model = wl.build_model().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    batch = {k: v.to(dev) for k, v in wl.batch_fn(batch_size).items()}
    base = {"workload": spec, "batch": batch_size, "alloc_conf": alloc_conf, "torch": torch.__version__,
            "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(dev) if cuda else "cpu"}
    _timed(model, opt, batch, dev, warmup)
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    free_t = _timed(model, opt, batch, dev, steps)
    peak_alloc = torch.cuda.max_memory_allocated(dev) if cuda else 0
    peak_res = torch.cuda.max_memory_reserved(dev) if cuda else 0
    total = torch.cuda.get_device_properties(dev).total_memory if cuda else 0
    t0 = statistics.median(free_t)
    append_line(out, {**base, "cap": None, "step_s": t0, "peak_allocated": peak_alloc, "peak_reserved": peak_res,
                      "total": total})
    print(f"{spec} b{batch_size} {alloc_conf or 'default'}: {t0 * 1e3:.1f} ms, allocated {peak_alloc / 1e9:.2f} GB, "
          f"reserved {peak_res / 1e9:.2f} GB", flush=True)
    for cap in CAPS if cuda else CAPS[:2]:
        row = {**base, "cap": cap, "cap_bytes": int(cap * peak_res), "peak_allocated_free": peak_alloc,
               "peak_reserved_free": peak_res, "step_s_free": t0}
        try:
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.set_per_process_memory_fraction(min(1.0, cap * peak_res / total), dev)
                torch.cuda.reset_peak_memory_stats(dev)
                _timed(model, opt, batch, dev, 2)
                s0 = torch.cuda.memory_stats(dev)
            ts = _timed(model, opt, batch, dev, steps)
            if cuda:
                s1 = torch.cuda.memory_stats(dev)
                for k in ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_ooms"):
                    row[k + "_per_step"] = (s1.get(k, 0) - s0.get(k, 0)) / steps
                row["peak_reserved"] = torch.cuda.max_memory_reserved(dev)
            row.update(step_s=statistics.median(ts), slowdown=statistics.median(ts) / t0, oom=False)
        except torch.OutOfMemoryError:
            opt.zero_grad(set_to_none=True)
            row.update(oom=True)
        append_line(out, row)
        print(f"  cap {cap:.2f}: " + ("OOM" if row["oom"] else
              f"{row['step_s'] * 1e3:.1f} ms ({row['slowdown']:.2f}x), retries/step "
              f"{row.get('num_alloc_retries_per_step', 0):.1f}, cudaMalloc/step {row.get('num_device_alloc_per_step', 0):.1f}"),
              flush=True)
        if row["oom"]:
            break


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="one small configuration, two steps")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--timeout", type=float, default=150, help="seconds per child (default 150)")
    ap.add_argument("--child", nargs=3, metavar=("SPEC", "BATCH", "ALLOC_CONF"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    steps, warmup = (2, 1) if a.quick else (8, 3)
    if a.child:
        child(a.child[0], int(a.child[1]), a.device, steps, warmup, a.out, a.child[2])
        return
    if a.out is None:
        import torch

        from gpuwise.plan.catalog import gpu_slug

        name = torch.cuda.get_device_name(0) if a.device.startswith("cuda") else "cpu"
        a.out = ROOT / "benchmarks/truth/kernels" / f"{gpu_slug(name)}-pressure.jsonl"
    configs = [(W + "gpt2_small.py", 1, "")] if a.quick else CONFIGS
    for spec, b, conf in configs:
        env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": conf} if conf else dict(os.environ)
        cmd = [sys.executable, __file__, "--device", a.device, "--out", str(a.out), "--child", spec, str(b), conf]
        if a.quick:
            cmd.insert(2, "--quick")
        try:
            subprocess.run(cmd, env=env, timeout=a.timeout, cwd=ROOT, check=False)
        except subprocess.TimeoutExpired:
            print(f"{spec} b{b} {conf}: timed out after {a.timeout:.0f} s", flush=True)
    print(json.dumps({"out": str(a.out)}))


if __name__ == "__main__":
    main()
