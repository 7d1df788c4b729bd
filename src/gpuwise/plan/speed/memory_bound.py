"""Memory-bound kernels (elementwise, norms, softmax, reductions, copies, optimizer updates): bytes read
and written at the achievable fraction of the datasheet bandwidth (plan/catalog.py MEMORY_EFFICIENCY,
from published streaming-copy measurements)."""

from __future__ import annotations


def memory_bound_s(nbytes: float, bandwidth_bytes_per_s: float, memory_efficiency: float) -> float:
    if nbytes <= 0 or bandwidth_bytes_per_s <= 0:
        return 0.0
    return nbytes / (bandwidth_bytes_per_s * memory_efficiency)
