"""Fused attention time: the SDPA kernel the GPU runs, at its fraction of peak for the call's problem shape.

    flash (FlashAttention-2, what torch's SDPA flash backend runs):
        Ampere/Ada: "reaching 50-73% of the theoretical maximum FLOPs/s on A100" (Dao, FlashAttention-2,
        ICLR 2024, abstract); forward at the top of that range, backward lower (its Fig. 5/6): 0.70 / 0.50.
        Hopper: measured on an H200 (torch 2.11's FlashAttention-2 SDPA backend, bf16, causal, batch 1 x 32
        heads x seq 8192 x head dim 128; benchmarks/truth/kernels/nvidia-h200-ops.jsonl, fraction at REFERENCE
        as benchmarks/fit_attention.py prints it): 0.313 forward, 0.281 backward -- in line with "FlashAttention-2
        achieves only 35% utilization on the H100" (Shah et al., FlashAttention-3, NeurIPS 2024, sec. 1), which
        does not split forward from backward (it had been taken for both: the H200's fwd+bwd rows came 17-26 %
        under, its backward alone 20 %).
    efficient (xformers / CUTLASS memory-efficient attention): FlashAttention-2 is ~2x faster than it
        on A100 (FlashAttention-2 paper, sec. 4.1, "1.3-2.5x faster than ... xformers", 2x taken): half
        of flash's fraction. Hopper: half of the FlashAttention-3 paper's 35 %, 0.175 (where Hopper runs it:
        fp32 steps, 3xTF32, whose H100/H200 truth steps it prices within about 10 %; the H200's bf16 row measured
        0.163 forward, 0.126 backward, and taking those moved the fp32 truth steps 4-6 points slower, so the
        bf16 measurement is not applied to the fp32 kernel).
    cudnn (cuDNN fused attention, sm90+): on Hopper measured: 0.59 forward, 0.53 backward on an H200
        (torch 2.11 / cuDNN SDPA, bf16, causal, batch 1 x 32 heads x seq 8192 x head dim 128: 941 us forward,
        2.62 ms backward; benchmarks/truth/kernels/nvidia-h200-ops.jsonl, the FA3 paper's "up to 75 %" level
        less its causal loss). Ampere: FlashAttention-2's fractions (cuDNN on sm80 runs FA2-class kernels).
    triton (FlashAttention written in Triton, e.g. llm-foundry's attn_impl: triton): "FlashAttention-2 is
        around 1.3-1.5x faster than FlashAttention in Triton in the forward pass and around 2x faster in
        the backward pass" (FlashAttention-2 paper, sec. 4.1, A100): flash's fractions / 1.4 forward and
        / 2 backward. On Hopper the same ratios are applied to FlashAttention-2's measured Hopper fractions (no
        published H100 comparison; an assumption).
These fractions are each kernel's at a long sequence (REFERENCE: 8192 causal, where the papers' and the
H200's numbers were taken). A call's own fraction scales with its problem (`shape_factor`): the kernels run
TILE x TILE blocks of the (seq_q x seq_k) score matrix, one query row-block per thread block
(FlashAttention-2 paper, Algorithm 1 and sec. 3.2): a partial edge tile costs a whole one (tile
quantisation), a causal row-block computes its diagonal tile whole, and each row-block pays a fixed
prologue/epilogue (load its Q tile, write O and the logsumexp; not overlapped with the MMA pipeline) worth
ROW_BLOCK_TILES tiles of the main loop. That constant is fitted per kernel and phase to the H200 rows that
are not launch-bound (forward >= 200 us and forward+backward >= 1 ms: 5 shapes; smaller rows time the host
floor) with the fraction fixed at REFERENCE (benchmarks/fit_attention.py prints the fit); the H200 per-step
profiles (benchmarks/truth/kernels/nvidia-h200.jsonl: GPT-2, ViT-B/16, a Llama-1B-shaped decoder) are the
held-out check. A head dim the kernel has no instance for is computed at the next one it has (`computed_head_dim`):
FlashAttention-2 instantiates head dims 32, 64, 96, 128, 160, 192, 224, 256 and runs a call on the smallest
not below its own (flash-attn csrc/flash_attn/src/static_switch.h HEADDIM_SWITCH, torch's copy under
aten/src/ATen/native/transformers/cuda/flash_attn/); FlashAttention in Triton pads it to a power of two
(`BLOCK_HEADDIM = max(triton.next_power_of_2(d), 16)`, flash_attn_triton.py, llm-foundry's copy too): Phi-2's
head dim 80 runs as 96 in FlashAttention-2 (1.2x the FLOPs counted), as 128 in Triton. Not modelled otherwise: head dim (the H200's cuDNN and flash
kernels run head dim 64 at ~0.6-0.75 of the hd128 fraction at seq 8192, but the decoder's hd64 / seq 1024
profile is priced right without it), and dropout inside the kernel (GPT-2's attn_pdrop 0.1: its cuDNN forward runs ~2.5x slower per FLOP than the
decoder's without dropout).

Which kernel a GPU runs (`sdpa_kernel_on`): the trace picks flash > efficient > math as torch's default order
(plan/tracing/sdpa.py), which sets the memory. torch puts cuDNN first on sm90 / sm100 / sm103 when the
runtime cuDNN is newer than 9.15.0 (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp
check_prefer_cudnn_attention: `cudnn_version > 91500 && (major == 9 || major == 10)`, minor 0 or 3 on CUDA
12 wheels, off with TORCH_CUDNN_SDPA_DEPRIORITIZED=1; the seq-not-a-multiple-of-128 fix in cuDNN 9.15.1,
pytorch#169849); that code is in torch 2.10 and the wheels' bundled cuDNN crosses the threshold from torch
2.11 (huggingface/transformers#48163, maintainers' analysis; torch 2.9.1 still runs flash first, and the
H200 profiles under torch 2.11 ran cudnn_generated_fort_native_sdpa_sm90_flash_fprop/bprop). cuDNN takes
head dim <= 128 there (check_cudnn_tensor_shapes; 256 only with cuDNN > 9.22). So for speed, flash calls
of head dim <= 128 are priced as cudnn on those GPUs under torch >= 2.11 (the installed torch's version
stands for the GPU machine's unless GPUWISE_GPU_TORCH_VERSION says otherwise); their tensors are flash's (cuDNN keeps the same output and logsumexp).

In fp32 (flash and cuDNN take only fp16/bf16, so SDPA runs the memory-efficient kernel): on sm80+ its GEMMs
are `OpClassTensorOp` with `OpMultiplyAddFastF32`, three TF32 MMAs per product (pytorch
aten/src/ATen/native/transformers/cuda/mem_eff_attention/gemm_kernel_utils.h, DefaultGemmType for float,
kMinComputeCapability >= 80): its peak is the TF32 peak / 3; before sm80, SIMT at the fp32 peak.
The math backend is not a fused kernel: the trace records its bmm / softmax ops, priced as GEMMs and
memory-bound ops.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os

# (kernel, architecture family) -> (forward, backward) fraction of the GPU's peak matmul FLOP/s
EFFICIENCY = {
    ("flash", "ampere"): (0.70, 0.50),
    ("flash", "hopper"): (0.313, 0.281),
    ("efficient", "ampere"): (0.35, 0.25),
    ("efficient", "hopper"): (0.175, 0.175),
    ("cudnn", "hopper"): (0.59, 0.53),
    ("cudnn", "ampere"): (0.70, 0.50),  # cuDNN on sm80 runs FlashAttention-2-class kernels
    ("triton", "ampere"): (0.70 / 1.4, 0.50 / 2),
    ("triton", "hopper"): (0.313 / 1.4, 0.281 / 2),
}
TILE = 128                 # rows and columns of the score matrix one thread block computes per step
REFERENCE = (8192, 8192, True)   # (seq_q, seq_k, causal) the EFFICIENCY fractions stand for
# kernel -> (forward, backward) prologue/epilogue of one query row-block, in main-loop tiles: least squares of
# log(time) over the H200's non-launch-bound rows (benchmarks/fit_attention.py); triton takes flash's
ROW_BLOCK_TILES = {"flash": (1.5, 3.25), "efficient": (2.0, 2.5), "cudnn": (4.5, 4.25), "triton": (1.5, 3.25)}
FLASH_HEAD_DIMS = (32, 64, 96, 128, 160, 192, 224, 256)  # FlashAttention-2's kernel instances (module doc)
CUDNN_FIRST_TORCH = (2, 11)
CUDNN_MAX_HEAD_DIM = 128
ARCH_FAMILY = {"ampere": "ampere", "ada": "ampere", "turing": "ampere", "volta": "ampere",
               "hopper": "hopper", "blackwell": "hopper", "cdna3": "hopper"}


def attention_peak(gpu, itemsize: int, half_peak: float) -> float:
    """Peak FLOP/s the fused kernel's GEMMs run at: tensor cores for 2-byte operands, 3xTF32 (or fp32 SIMT
    on GPUs without TF32) for fp32 operands (see the module docstring)."""
    if itemsize <= 2:
        return half_peak
    tf32 = gpu.flops.get("tf32", 0.0)
    return tf32 / 3 if tf32 else gpu.peak_flops("fp32")


def shape_factor(seq_q: int, seq_k: int, causal: bool, row_block_tiles: float) -> float:
    """Useful fraction of a fused kernel's work for one (seq_q x seq_k) score matrix: the FLOPs counted (half the
    square when causal) over the tiles computed, each row-block's prologue/epilogue added (module docstring)."""
    rows, cols = math.ceil(seq_q / TILE), math.ceil(seq_k / TILE)
    if rows <= 0 or cols <= 0:
        return 1.0
    if causal:  # row-block i sees the key tiles up to its diagonal (top-left aligned, as torch's is_causal)
        tiles = sum(min(cols, math.ceil(min((i + 1) * TILE, seq_q) / TILE)) for i in range(rows))
        useful = seq_q * seq_k / 2
    else:
        tiles, useful = rows * cols, seq_q * seq_k
    return useful / (TILE * TILE * tiles) * tiles / (tiles + row_block_tiles * rows)


def computed_head_dim(kernel: str, head_dim: int) -> int:
    """The head dim `kernel` computes a call of `head_dim` at (module doc); others' as given."""
    if kernel == "flash":
        return next((d for d in FLASH_HEAD_DIMS if d >= head_dim), head_dim)
    if kernel == "triton":
        return max(16, 1 << max(head_dim - 1, 0).bit_length())
    return head_dim


def attention_s(flops: float, kernel: str, phase: str, arch: str, peak_flops: float,
                shape: tuple[int, int, bool] | None = None) -> float:
    """Seconds for `flops` of fused attention `kernel` ("flash" | "efficient" | "cudnn" | "triton") in `phase`;
    `shape` (seq_q, seq_k, causal) of the calls, else the kernel's long-sequence fraction."""
    if flops <= 0 or peak_flops <= 0:
        return 0.0
    fwd, bwd = EFFICIENCY.get((kernel, ARCH_FAMILY.get(arch, "ampere")), EFFICIENCY[("efficient", "ampere")])
    fraction = bwd if phase == "backward" else fwd
    if shape is not None:
        c = ROW_BLOCK_TILES.get(kernel, ROW_BLOCK_TILES["efficient"])[1 if phase == "backward" else 0]
        fraction *= shape_factor(*shape, c) / shape_factor(*REFERENCE, c)
    return flops / (peak_flops * fraction)


_GPU_TORCH: contextvars.ContextVar[str | None] = contextvars.ContextVar("gpuwise_gpu_torch", default=None)


@contextlib.contextmanager
def gpu_torch(version: str | None):
    """Inside: the GPU runs torch `version` (a GPU truth record's, a published run's era), not the installed one."""
    token = _GPU_TORCH.set(version or None)
    try:
        yield
    finally:
        _GPU_TORCH.reset(token)


def sdpa_kernel_on(capability: tuple[int, int] | None, torch_version: str | None = None,
                   env: dict | None = None) -> tuple[str, str]:
    """("cudnn" | "flash", why): the fused kernel torch's default order runs first for fp16/bf16 SDPA calls
    that flash can run, on a GPU of `capability` under `torch_version` (by default GPUWISE_GPU_TORCH_VERSION,
    the GPU machine's torch where it is not the installed one, or `gpu_torch`'s; else the installed torch's)."""
    env = os.environ if env is None else env
    if torch_version is None:
        torch_version = _GPU_TORCH.get() or env.get("GPUWISE_GPU_TORCH_VERSION", "")
    if not torch_version:
        import torch

        torch_version = torch.__version__
    try:
        version = tuple(int(x) for x in torch_version.split("+")[0].split(".")[:2])
    except ValueError:
        return "flash", f"torch {torch_version}: version not read, flash first assumed"
    if capability is None or capability[0] not in (9, 10) or capability[1] not in (0, 3):
        return "flash", "flash first (cuDNN attention is preferred on sm90/sm100/sm103 only)"
    sm = f"sm{capability[0]}{capability[1]}"
    if version < CUDNN_FIRST_TORCH:
        return "flash", (f"torch {torch_version}: flash first on {sm} (cuDNN attention first from torch "
                         f"{CUDNN_FIRST_TORCH[0]}.{CUDNN_FIRST_TORCH[1]}, whose wheels bundle cuDNN >= 9.15.1)")
    if env.get("TORCH_CUDNN_SDPA_DEPRIORITIZED", "").lower() in ("1", "true", "on", "yes"):
        return "flash", f"TORCH_CUDNN_SDPA_DEPRIORITIZED is set: flash first on {sm}"
    return "cudnn", (f"torch {torch_version} on {sm} runs cuDNN attention first (sdp_utils.cpp "
                     f"check_prefer_cudnn_attention): flash calls of head dim <= {CUDNN_MAX_HEAD_DIM} priced as cudnn")


def as_gpu_runs(costs, capability: tuple[int, int] | None, attn: str | None = None):
    """(costs, why | None): `costs` (ops.py OpCosts) with the flash calls the GPU runs as cuDNN attention priced
    as cudnn (`sdpa_kernel_on`); a forced kernel (--attn flash / triton) stays as it is."""
    if attn in ("flash", "triton") or not any(k == "flash" for _, k, *_ in costs.attention):
        return costs, None
    kernel, why = sdpa_kernel_on(capability)
    if kernel != "cudnn":
        return costs, None
    return costs.relabel_attention("flash", "cudnn", max_head_dim=CUDNN_MAX_HEAD_DIM), why
