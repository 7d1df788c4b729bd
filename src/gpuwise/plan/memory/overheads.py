"""What a real CUDA process holds beyond the tensors the trace sees: library workspaces and the context.

Two kinds, kept apart because they land in different places:

- **workspaces allocated through the caching allocator** (cuBLAS per handle and stream, cuDNN scratch
  for convolutions). They count in `torch.cuda.memory_allocated()`/`memory_reserved()`, so they are
  inserted into the event list as allocations and replayed through the allocator model;
- **memory outside the allocator**: the CUDA context (driver state, module images of the kernels that
  were loaded lazily, cuBLAS/cuDNN handles). `nvidia-smi` shows it; `memory_reserved()` does not.

Numbers marked ESTIMATE are not measured yet: they come from public reports and will be replaced by
the truth records (`benchmarks/truth/*.jsonl`, measured on a real GPU). Hopper's context and the cuDNN
share are measured (H100_TRUTH below).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter

from .events import MemEvent, MemoryTrace

MIB = 1024**2
KIB = 1024

# CUDA context + lazily loaded kernels of a PyTorch process after one training step, by architecture
# (CUDA >= 11.7 loads modules lazily by default, CUDA_MODULE_LOADING=LAZY). What nvidia-smi shows for a
# process minus torch.cuda.memory_reserved(). Public reports: "around 400MB if CUDA >= 11.7 is used and
# lazy module loading enabled" for a bare context (pytorch/pytorch#109888), "~300MB" (pytorch/pytorch#107667);
# a training step loads more kernels (cuBLAS, optimizer, autograd), hence the larger numbers below.
# Hopper is measured: benchmarks/truth/nvidia-h100-80gb-hbm3.jsonl (NVIDIA H100 80GB HBM3, driver 580.159.04,
# torch 2.11.0+cu130, CUDA 13.0, lazy loading), NVML's per-process used memory minus the peak of
# memory_reserved() after 5 steps, 129 records (no OOM): 760 MiB median over the 75 transformer records
# (GPT-2 small, 1B decoder, BERT-base, ViT-B/16; spread 742-762), 742 over the 18 MLP records (740-742: fewer
# kernels loaded), 764 over the 36 convolution records (ResNet-50, ConvNeXt-T; 758-764, cuDNN below).
# The earlier ESTIMATE, 520 MiB from CUDA 12 reports of bare contexts plus a guess for a step's kernels, was
# 240 MiB low; no CUDA 12 training step on Hopper has been measured, so CUDA 12 gets the CUDA 13 number.
H100_TRUTH = "benchmarks/truth/nvidia-h100-80gb-hbm3.jsonl"
CONTEXT_BYTES: dict[str, int] = {
    "hopper": 760 * MIB,   # measured (H100_TRUTH: median of the transformer records, 742-762)
    "ampere": 430 * MIB,   # ESTIMATE (A100/A10/RTX 3090, CUDA 12.x): reports of 400-500 MiB
    "ada": 400 * MIB,      # ESTIMATE (L4/L40S/RTX 4090)
    "turing": 330 * MIB,   # ESTIMATE (T4)
    "volta": 330 * MIB,    # ESTIMATE (V100)
}
DEFAULT_ARCH = "hopper"

# The same with every kernel image of torch's CUDA libraries loaded when the context is created
# (CUDA_MODULE_LOADING=EAGER): the only way before CUDA 11.7, and torch's default before 1.13, which sets
# CUDA_MODULE_LOADING=LAZY when the user has not (NVIDIA CUDA C++ Programming Guide, "Lazy Loading").
# Measured: Hugging Face transformers docs perf_train_gpu_one (Jan 2022; Tesla V100-SXM2-16GB, driver
# 460.91.03, torch of that time): `torch.ones((1, 1)).to("cuda")` then "GPU memory occupied: 1343 MB"
# (NVML used // 1024**2, so MiB), less the caching allocator's 2 MiB segment holding that tensor.
EAGER_CONTEXT_BYTES: dict[str, int] = {
    "volta": 1341 * MIB,   # measured (above)
}
EAGER_CONTEXT_DEFAULT = 1341 * MIB  # ESTIMATE for other architectures: one torch build's images, same size
MODULE_LOADING = ("lazy", "eager")


def module_loading(value: str | None = None, env: dict[str, str] | None = None) -> str:
    """"lazy" or "eager": `value` when given, else CUDA_MODULE_LOADING from the environment (lazy when unset)."""
    if value is None:
        value = (os.environ if env is None else env).get("CUDA_MODULE_LOADING", "lazy")
    value = value.lower()
    return value if value in MODULE_LOADING else "lazy"


def context_bytes(arch: str, loading: str = "lazy") -> int:
    if loading == "eager":
        return EAGER_CONTEXT_BYTES.get(arch, EAGER_CONTEXT_DEFAULT)
    return CONTEXT_BYTES.get(arch, CONTEXT_BYTES[DEFAULT_ARCH])

# cuDNN handle and its kernel images, loaded the first time a convolution runs (outside the allocator).
# Measured (H100_TRUTH): the convolution records' 764 MiB outside the allocator less the transformers' 760
# (medians; ResNet-50 and ConvNeXt-T, 36 records, 758-764). The earlier ESTIMATE was 80 MiB.
CUDNN_CONTEXT_BYTES = 4 * MIB

# Ops that call cuBLAS / cuBLASLt (their first call on a thread creates the handle and its workspace).
MATMUL_OPS = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_addmm_activation", "addbmm", "dot", "mv")
CONV_OPS = ("convolution", "conv1d", "conv2d", "conv3d", "cudnn_convolution", "convolution_backward")


def cublas_workspace_bytes(arch: str, env: dict[str, str] | None = None) -> int:
    """cuBLAS workspace per (handle, stream), allocated through the caching allocator.

    Source: aten/src/ATen/cuda/CublasHandlePool.cpp `parseChosenWorkspaceSize`: CUBLAS_WORKSPACE_CONFIG
    (":SIZE_KIB:COUNT" pairs, sizes summed) or the default ":4096:8" = 32 MiB on sm90 (Hopper) and newer,
    ":4096:2:16:8" = 8 MiB + 128 KiB elsewhere.
    """
    env = os.environ if env is None else env
    config = env.get("CUBLAS_WORKSPACE_CONFIG")
    if config:
        sizes = re.findall(r":([0-9]+):([0-9]+)", config)
        if sizes:
            return sum(int(size) for size, _ in sizes) * KIB
        return 4096 * KIB  # "Could not parse CUBLAS_WORKSPACE_CONFIG, using default workspace size of 4096."
    return 4096 * 8 * KIB if arch in ("hopper", "blackwell") else (4096 * 2 + 16 * 8) * KIB


def cublaslt_workspace_bytes(arch: str, env: dict[str, str] | None = None) -> int:
    """Extra cuBLASLt workspace (addmm with bias, GELU epilogues).

    ESTIMATE: recent torch (CublasHandlePool.cpp `getCUDABlasLtWorkspace`) hands cuBLASLt the cuBLAS
    workspace of the same handle and stream, so nothing extra; CUBLASLT_WORKSPACE_SIZE (KiB) set
    explicitly gives it its own allocation. Check on GPU.
    """
    env = os.environ if env is None else env
    value = env.get("CUBLASLT_WORKSPACE_SIZE")
    return int(value) * KIB if value and value.isdigit() else 0


@functools.lru_cache(maxsize=4096)  # a trace has a few dozen distinct ops over its ~10^5 events
def op_matches(op: str, names: tuple[str, ...]) -> bool:
    base = op.split("kernel workspace:")[-1].strip().split("::")[-1].split(".")
    # "aten.addmm.default" -> ["aten", "addmm", "default"]; "aten::mm" -> ["mm"]
    return any(part in names for part in base)


@dataclass(frozen=True)
class Overheads:
    """The process's memory beyond the tensors, for `device_used_bytes`."""

    context_bytes: int           # CUDA context + kernel images (outside the allocator)
    cudnn_bytes: int             # cuDNN handle/kernels when convolutions run (outside the allocator)
    workspace_bytes: int         # cuBLAS/cuBLASLt workspaces inserted into the allocator replay
    workspaces: tuple[tuple[str, int], ...]
    arch: str
    module_loading: str = "lazy"  # CUDA module loading the context size assumes (lazy / eager)
    nccl_bytes: int = 0          # NCCL's communicator buffers of a data-parallel rank (nccl.py; outside the allocator)

    @property
    def outside_allocator_bytes(self) -> int:
        return self.context_bytes + self.cudnn_bytes + self.nccl_bytes


# A workspace rule: (name, bytes(arch, env), phases whose thread holds its own handle). The forward
# runs on the caller's thread, backward on autograd's device thread: cuBLAS handles are per thread
# (DeviceThreadHandlePool PoolWindow is thread_local) and workspaces per (handle, stream), so each thread
# that runs a matmul holds one workspace. ESTIMATE: two threads -> two workspaces; check on GPU.
WORKSPACE_RULES: list[tuple[str, Callable[[str, dict | None], int], tuple[str, ...]]] = [
    ("cuBLAS workspace (caller thread)", cublas_workspace_bytes, ("setup", "forward", "optimizer", "zero_grad")),
    ("cuBLAS workspace (autograd thread)", cublas_workspace_bytes, ("backward",)),
    ("cuBLASLt workspace", cublaslt_workspace_bytes, ("setup", "forward", "optimizer", "zero_grad")),
]


def replay_inputs(arch: str, env: dict | None = None) -> tuple[int, ...]:
    """What of `arch` goes into the allocator replay: the sizes of the workspaces `add_workspaces` inserts.
    Architectures with equal values replay a trace alike; only the bytes outside the allocator differ."""
    return tuple(size_fn(arch, env) for _, size_fn, _ in WORKSPACE_RULES)


def add_workspaces(trace: MemoryTrace, arch: str = DEFAULT_ARCH, env: dict | None = None,
                   loading: str | None = None, nccl_bytes: int = 0) -> tuple[MemoryTrace, Overheads]:
    """A copy of `trace` with the persistent library workspaces allocated where the first matmul of each
    thread runs (never freed: torch caches them until the process ends), and the overheads for nvidia-smi.
    `loading`: CUDA module loading, "lazy" / "eager" (default: CUDA_MODULE_LOADING, else lazy); `nccl_bytes`:
    the rank's NCCL buffers (nccl.py `buffer_bytes`; 0 on one GPU)."""
    events = list(trace.events)
    next_block = max(map(attrgetter("block"), events), default=0) + 1
    inserts: list[tuple[int, MemEvent]] = []
    added: list[tuple[str, int]] = []
    for name, size_fn, phases in WORKSPACE_RULES:
        nbytes = size_fn(arch, env)
        if nbytes <= 0:
            continue
        first = next((i for i, ev in enumerate(events) if ev.action == "alloc" and ev.phase in phases
                      and op_matches(ev.op, MATMUL_OPS)), None)
        if first is None:
            continue
        ev = events[first]
        inserts.append((first + 1, MemEvent("alloc", next_block, nbytes, "temporary", ev.phase, ev.module,
                                            f"kernel workspace: {name}", ev.stream)))
        next_block += 1
        added.append((name, nbytes))
    steady = trace.steady_start
    for pos, ev in sorted(inserts, key=lambda x: x[0], reverse=True):
        events.insert(pos, ev)
        if pos <= steady:
            steady += 1
    has_conv = any(op_matches(op, CONV_OPS) for op in set(map(attrgetter("op"), trace.events)))
    overheads = Overheads(
        context_bytes=context_bytes(arch, module_loading(loading, env)),
        cudnn_bytes=CUDNN_CONTEXT_BYTES if has_conv else 0,
        workspace_bytes=sum(n for _, n in added), workspaces=tuple(added), arch=arch,
        module_loading=module_loading(loading, env), nccl_bytes=nccl_bytes,
    )
    new = MemoryTrace(events, steady, trace.device_type, trace.method, list(trace.notes))
    for attr in ("flops_per_step",):
        if hasattr(trace, attr):
            setattr(new, attr, getattr(trace, attr))
    return new, overheads
