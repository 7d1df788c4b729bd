"""GEMM time on a GPU: tile and wave quantisation on its SMs, at the GPU's matmul efficiency (plan/catalog.py
`SpeedSpec.gemm_efficiency`: the sustained, power-saturated fraction (MSMF) for 16-bit GEMMs where it is published,
else the best-shape burst fraction (MAMF)).

NVIDIA, "Matrix Multiplication Background User's Guide" (docs.nvidia.com/deeplearning/performance/
dl-performance-matrix-multiplication): cuBLAS splits C (M x N) into thread-block tiles; a partial tile
costs a whole one (tile quantisation) and tiles run in waves of one per SM, a partial last wave
costing a whole wave (wave quantisation). A GEMM whose operands are small for its FLOPs is memory
bound instead: time = max(compute, bytes / achievable bandwidth) per call.

Tile 128 x 128: the guide's examples and cuBLAS's common half-precision tile on sm80/sm90. When there
are fewer tiles than SMs, cuBLAS splits K across thread blocks (split-K), so waves are counted on
tiles x splits, with splits <= SMs / tiles and each K slice >= 4 x the tile (an assumption of this
model, not a tuned number).

Alignment: "Tensor Cores are used ... most efficiently when dimensions are multiples of 16 bytes" (8 elements
in fp16/bf16; same guide, "Tensor Core Requirements"), and nanoGPT pads GPT-2's vocabulary 50257 to 50304
for that reason (karpathy/nanoGPT model.py, "vocab_size ... padded up to nearest multiple of 64 for
efficiency"). A half-precision GEMM whose leading dimensions or base pointers are not 16-byte aligned falls
to cuBLAS's align-1 fallback (scalar loads, sm75 mma.sync: `cutlass_75_tensorop_bf16_s1688gemm_bf16_*_align1`).
MISALIGNED_EFFICIENCY is that fallback's measured fraction of peak: benchmarks/truth/kernels/nvidia-h200.jsonl,
config gpt2_small b8 adamw bf16, the LM head (8192 tokens x 768 x vocab 50257) forward + its two backward
GEMMs, the three align1 kernels: 6.68 + 4.52 + 4.30 ms for 3 x 2 x 8192 x 50257 x 768 FLOP = 122 TFLOP/s,
0.124 of the H200's 989.5 dense bf16. Other GPUs take the same fraction of their peak (an assumption: the
fallback is load-bound, measured on the H200 only).
"""

from __future__ import annotations

import math

TILE_M = TILE_N = 128
MIN_K_SLICE = 4 * 128
ALIGN_BYTES = 16
MISALIGNED_EFFICIENCY = 0.124


def gemm_s(batch: int, m: int, n: int, k: int, itemsize: int, peak_flops: float, sm_count: int,
           matmul_efficiency: float, bandwidth_bytes_per_s: float, aligned: bool = True) -> float:
    """Seconds for one (batched) GEMM C[m, n] = A[m, k] B[k, n], `batch` times; `aligned`: every operand
    16-byte aligned (a half-precision GEMM that is not runs at MISALIGNED_EFFICIENCY)."""
    if min(batch, m, n, k) <= 0 or peak_flops <= 0:
        return 0.0
    if not aligned and itemsize <= 2:
        matmul_efficiency = min(matmul_efficiency, MISALIGNED_EFFICIENCY)
    tiles = batch * math.ceil(m / TILE_M) * math.ceil(n / TILE_N)
    splits = max(1, min(sm_count // tiles, k // MIN_K_SLICE)) if tiles < sm_count else 1
    waves = math.ceil(tiles * splits / sm_count)
    per_sm_flops = peak_flops * matmul_efficiency / sm_count
    compute_s = waves * (2 * TILE_M * TILE_N * (k / splits)) / per_sm_flops
    memory_s = batch * (m * k + k * n + m * n) * itemsize / bandwidth_bytes_per_s
    return max(compute_s, memory_s)
