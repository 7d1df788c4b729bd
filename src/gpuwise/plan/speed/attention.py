"""Fused attention time: the SDPA kernel the trace says runs, at its published fraction of peak.

    flash (FlashAttention-2, what torch's SDPA flash backend runs):
        Ampere/Ada: "reaching 50-73% of the theoretical maximum FLOPs/s on A100" (Dao, FlashAttention-2,
        ICLR 2024, abstract); forward at the top of that range, backward lower (its Fig. 5/6): 0.70 / 0.50.
        Hopper: "FlashAttention-2 achieves only 35% utilization on the H100" (Shah et al.,
        FlashAttention-3, NeurIPS 2024, sec. 1): 0.35 forward and backward.
    efficient (xformers / CUTLASS memory-efficient attention): FlashAttention-2 is ~2x faster than it
        on A100 (FlashAttention-2 paper, sec. 4.1, "1.3-2.5x faster than ... xformers", 2x taken): half
        of flash's fraction.
    cudnn (cuDNN fused attention, sm90+): at FlashAttention-3's level (FA3 paper compares cuDNN
        9 as on par): 0.60 forward (FA3: "up to 740 TFLOPs/s (75% utilization)" in FP16 forward, short
        and causal sequences lower), 0.45 backward.
    triton (FlashAttention written in Triton, e.g. llm-foundry's attn_impl: triton): "FlashAttention-2 is
        around 1.3-1.5x faster than FlashAttention in Triton in the forward pass and around 2x faster in
        the backward pass" (FlashAttention-2 paper, sec. 4.1, A100): flash's fractions / 1.4 forward and
        / 2 backward. On Hopper the same ratios are applied to FlashAttention-2's H100 fraction (no
        published H100 comparison; an assumption).
In fp32 (flash and cuDNN take only fp16/bf16, so SDPA runs the memory-efficient kernel): on sm80+ its GEMMs
are `OpClassTensorOp` with `OpMultiplyAddFastF32`, three TF32 MMAs per product (pytorch
aten/src/ATen/native/transformers/cuda/mem_eff_attention/gemm_kernel_utils.h, DefaultGemmType for float,
kMinComputeCapability >= 80): its peak is the TF32 peak / 3; before sm80, SIMT at the fp32 peak.
The math backend is not a fused kernel: the trace records its bmm / softmax ops, priced as GEMMs and
memory-bound ops.
"""

from __future__ import annotations

# (kernel, architecture family) -> (forward, backward) fraction of the GPU's peak matmul FLOP/s
EFFICIENCY = {
    ("flash", "ampere"): (0.70, 0.50),
    ("flash", "hopper"): (0.35, 0.35),
    ("efficient", "ampere"): (0.35, 0.25),
    ("efficient", "hopper"): (0.175, 0.175),
    ("cudnn", "hopper"): (0.60, 0.45),
    ("cudnn", "ampere"): (0.70, 0.50),  # cuDNN on sm80 runs FlashAttention-2-class kernels
    ("triton", "ampere"): (0.70 / 1.4, 0.50 / 2),
    ("triton", "hopper"): (0.35 / 1.4, 0.35 / 2),
}
ARCH_FAMILY = {"ampere": "ampere", "ada": "ampere", "turing": "ampere", "volta": "ampere",
               "hopper": "hopper", "blackwell": "hopper", "cdna3": "hopper"}


def attention_peak(gpu, itemsize: int, half_peak: float) -> float:
    """Peak FLOP/s the fused kernel's GEMMs run at: tensor cores for 2-byte operands, 3xTF32 (or fp32 SIMT
    on GPUs without TF32) for fp32 operands (see the module docstring)."""
    if itemsize <= 2:
        return half_peak
    tf32 = gpu.flops.get("tf32", 0.0)
    return tf32 / 3 if tf32 else gpu.peak_flops("fp32")


def attention_s(flops: float, kernel: str, phase: str, arch: str, peak_flops: float) -> float:
    """Seconds for `flops` of fused attention `kernel` ("flash" | "efficient" | "cudnn" | "triton") in `phase`."""
    if flops <= 0 or peak_flops <= 0:
        return 0.0
    fwd, bwd = EFFICIENCY.get((kernel, ARCH_FAMILY.get(arch, "ampere")), EFFICIENCY[("efficient", "ampere")])
    return flops / (peak_flops * (bwd if phase == "backward" else fwd))
