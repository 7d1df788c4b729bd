"""Memory-bound kernels (elementwise, norms, softmax, reductions, copies, optimizer updates): bytes read
and written at the achievable fraction of the datasheet bandwidth (plan/catalog.py MEMORY_EFFICIENCY,
from published streaming-copy measurements) when TensorIterator runs its vectorised loop.

The other loops (plan/speed/ops.py _kernel_path says which runs) reach less, measured as a fraction of the
datasheet bandwidth on an H200 (4.8 TB/s) from benchmarks/truth/kernels/nvidia-h200.jsonl: the kernels of that
loop (by name) against the bytes the trace gives the ops the model puts on it, same configuration:
    unrolled (dynamic casting, `unrolled_elementwise_kernel`): gpt2_small b8 adamw bf16, 207 kernels (the
        model: 207 ops, 18.35 GB) in 8.10 ms; vit_b16 b128 adamw bf16, 222 kernels (222 ops, 10.74 GB) in
        5.16 ms: 29.1 GB / 13.26 ms = 2.19 TB/s, 0.46.
    strided (offset calculator, `elementwise_kernel<128, ...>`): decoder_1b b8 adamw bf16 (RMSNorm and rotary
        broadcasts), 533 kernels in 20.41 ms for the model's 439 ops, 38.7 GB: 1.90 TB/s, 0.40.
    foreach (`multi_tensor_apply_kernel`, the optimizers' _foreach_ ops): gpt2_small 6.97 GB in 2.75 ms,
        decoder_1b 69.2 GB in 26.29 ms, vit_b16 4.85 GB in 1.90 ms: 81.0 GB / 30.94 ms = 2.62 TB/s, 0.55.
Other GPUs take the same fractions (an assumption: the loops are latency-bound per thread, measured on
the H200 only)."""

from __future__ import annotations

PATH_EFFICIENCY = {"unrolled": 0.46, "strided": 0.40, "foreach": 0.55}


def memory_bound_s(nbytes: float, bandwidth_bytes_per_s: float, memory_efficiency: float,
                   path: str = "vectorized") -> float:
    """Seconds to move `nbytes` on `path` (plan/speed/ops.py _kernel_path): vectorised kernels at the GPU's
    streaming efficiency, the slower loops at their measured fraction of datasheet bandwidth."""
    if nbytes <= 0 or bandwidth_bytes_per_s <= 0:
        return 0.0
    return nbytes / (bandwidth_bytes_per_s * min(memory_efficiency, PATH_EFFICIENCY.get(path, memory_efficiency)))
