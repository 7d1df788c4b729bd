"""GEMM time on a GPU: tile and wave quantisation on its SMs, at the best-shape matmul efficiency.

NVIDIA, "Matrix Multiplication Background User's Guide" (docs.nvidia.com/deeplearning/performance/
dl-performance-matrix-multiplication): cuBLAS splits C (M x N) into thread-block tiles; a partial tile
costs a whole one (tile quantisation) and tiles run in waves of one per SM, a partial last wave
costing a whole wave (wave quantisation). A GEMM whose operands are small for its FLOPs is memory
bound instead: time = max(compute, bytes / achievable bandwidth) per call.

Tile 128 x 128: the guide's examples and cuBLAS's common half-precision tile on sm80/sm90. When there
are fewer tiles than SMs, cuBLAS splits K across thread blocks (split-K), so waves are counted on
tiles x splits, with splits <= SMs / tiles and each K slice >= 4 x the tile (an assumption of this
model, not a tuned number).
"""

from __future__ import annotations

import math

TILE_M = TILE_N = 128
MIN_K_SLICE = 4 * 128


def gemm_s(batch: int, m: int, n: int, k: int, itemsize: int, peak_flops: float, sm_count: int,
           matmul_efficiency: float, bandwidth_bytes_per_s: float) -> float:
    """Seconds for one (batched) GEMM C[m, n] = A[m, k] B[k, n], `batch` times."""
    if min(batch, m, n, k) <= 0 or peak_flops <= 0:
        return 0.0
    tiles = batch * math.ceil(m / TILE_M) * math.ceil(n / TILE_N)
    splits = max(1, min(sm_count // tiles, k // MIN_K_SLICE)) if tiles < sm_count else 1
    waves = math.ceil(tiles * splits / sm_count)
    per_sm_flops = peak_flops * matmul_efficiency / sm_count
    compute_s = waves * (2 * TILE_M * TILE_N * (k / splits)) / per_sm_flops
    memory_s = batch * (m * k + k * n + m * n) * itemsize / bandwidth_bytes_per_s
    return max(compute_s, memory_s)
