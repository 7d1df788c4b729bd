"""Per-kernel GPU times of a few truth workloads, beside the speed model's price of each class, so the step-time
model can be checked kernel class by kernel class, not only by whole steps (benchmarks/truth_speed.py).

    python benchmarks/truth/profile_kernels.py                       # on a GPU: the default set (~2 min)
    python benchmarks/truth/profile_kernels.py --device cpu --quick  # the plumbing on a CPU

For each configuration: `torch.profiler` over `--steps` steady steps of gpuwise's own step (the truth records'
step), every device kernel's name, count and total time, grouped into the speed model's classes
(matmul: GEMM/cutlass/cuBLAS kernels; attention: flash/fmha/efficient; conv: cudnn/implicit-GEMM/convolution
kernels; the rest memory-bound), plus the profiler's CPU time per step (the host side). Written as one JSON
line per configuration, atomically, to `--out` (default benchmarks/truth/kernels/<gpu>.jsonl: not beside
the truth records, which `gpuwise.truth.read_records` reads as every *.jsonl of benchmarks/truth/).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gpuwise.jsonl import append_line  # noqa: E402

W = "benchmarks/truth/workloads/"
DEFAULT = [(W + "gpt2_small.py", 8, "adamw", "bf16"), (W + "gpt2_small.py", 8, "adamw", "fp32"),
           (W + "vit_b16.py", 128, "adamw", "bf16"), (W + "resnet50.py", 64, "adamw", "bf16"),
           (W + "resnet50.py", 64, "adamw", "fp32"), (W + "decoder_1b.py", 8, "adamw", "bf16"),
           ("examples:mlp", 4096, "adamw", "fp32"), (W + "convnext_t.py", 32, "adamw", "fp32"),
           (W + "convnext_t.py", 32, "adamw", "bf16")]
QUICK = [("examples:mlp", 8, "sgd", "fp32")]
CLASSES = (("attention", r"flash|fmha|attention|sdpa"), ("conv", r"conv|cudnn|implicit|winograd|fprop|dgrad|wgrad"),
           ("matmul", r"gemm|cutlass|cublas|sm\d+_xmma|nvjet|matmul"), ("optimizer", r"foreach|multi_tensor|fused_adam"))

# record_function / profiler-step names: no kernel signature (no '(' or '<'), a '#' (torch/profiler/profiler.py
# "ProfilerStep#" + step number; torch/optim/optimizer.py "Optimizer.step#{cls}.step")
ANNOTATION = re.compile(r"^[^(<]*#[^(<]*$")


def kernel_class(name: str) -> str:
    low = name.lower()
    for cls, pattern in CLASSES:
        if re.search(pattern, low):
            return cls
    return "memory_bound"


def is_annotation(ev) -> bool:
    """A GPU user annotation (`ProfilerStep#3`, `Optimizer.step#AdamW.step`, record_function ranges): a span on
    the GPU timeline over kernels counted on their own, not a kernel. torch's FunctionEvent says so
    (`is_user_annotation`, kineto's gpu_user_annotation activity); older torch: the `#` names record_function gives."""
    flag = getattr(ev, "is_user_annotation", None)
    if flag is not None:
        return bool(flag)
    return bool(ANNOTATION.match(ev.name))


def profile(workload: str, batch: int, optimizer: str, precision: str, device: str, steps: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from gpuwise.step import StepConfig, TrainStep
    from gpuwise.workload import load_workload

    dev = torch.device(device)
    wl = load_workload(workload)
    step = TrainStep(wl, StepConfig(optimizer=optimizer, precision=precision), dev)
    data = wl.build_batch(batch)
    for _ in range(3):  # warm-up: allocator, cuDNN/cuBLAS heuristics, lazy modules
        step.step(data)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with torch_profile(activities=acts) as prof:
        for _ in range(steps):
            step.step(data)
        if dev.type == "cuda":
            torch.cuda.synchronize()
    kernels: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if dev.type == "cuda" and ev.device_type == torch.autograd.DeviceType.CUDA and not is_annotation(ev):
            k = kernels[ev.name]
            k[0] += 1
            k[1] += ev.time_range.elapsed_us()  # a kernel's own duration on the GPU
    classes: dict[str, float] = defaultdict(float)
    for name, (_, us) in kernels.items():
        classes[kernel_class(name)] += us / steps / 1e6
    top = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:60]
    cpu_ops = sum(1 for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CPU
                  and ev.name.startswith("aten::")) / steps
    return {"workload": workload, "batch_size": batch, "optimizer": optimizer, "precision": precision,
            "device": str(dev), "gpu_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
            "torch": torch.__version__, "steps": steps, "kernel_s_per_step": classes,
            "kernels_per_step": sum(c for c, _ in kernels.values()) / steps, "aten_ops_per_step": cpu_ops,
            "top_kernels": [{"name": n[:200], "calls_per_step": c / steps, "s_per_step": us / steps / 1e6}
                            for n, (c, us) in top]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="one tiny configuration (plumbing)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--only", help="regular expression: only the configurations whose workload matches it")
    ap.add_argument("--out", help="JSON lines file (default benchmarks/truth/kernels/<gpu>.jsonl)")
    args = ap.parse_args()
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("profile_kernels: no CUDA GPU here (use --device cpu --quick for the plumbing)", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    out = Path(args.out or ROOT / "benchmarks" / "truth" / "kernels" / f"{slug}.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    for w, b, o, p in QUICK if args.quick else DEFAULT:
        if args.only and not re.search(args.only, w):
            continue
        print(f"profile_kernels: {w} b={b} {o} {p}", file=sys.stderr, flush=True)
        try:
            rec = profile(w, b, o, p, args.device, args.steps)
        except Exception as exc:  # noqa: BLE001 - one configuration failing must not lose the others
            print(f"  failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        append_line(out, rec)
        print(json.dumps({k: rec[k] for k in ("workload", "precision", "kernel_s_per_step")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
