"""Kernel launch and host dispatch: what a step costs beyond its kernels' work.

    GPU side: back-to-back kernels on one stream leave a gap of about 1 us each (launch latency,
        block scheduling, tail): "cudaLaunchKernel ... ~1-3 us on CUDA 12+ drivers" (J. Lin, "From
        PyTorch op to kernel launch", lesson 18); 1 us per kernel taken as the on-GPU gap.
    Host side: eager PyTorch spends "~5-25 us of CPU-side work per op" from Python to the launch
        (same source, layer table); a published H100 probe measured 4.2 us for "one operation issued
        from Python". The trace counts aten ops, several per Python call (autograd, views), so 4 us
        per aten op is taken (the lower end), views included.
The host runs ahead of the GPU asynchronously, so a step costs max(GPU time, host time): the host
shows only when the GPU outruns it (small models, small batches).
"""

from __future__ import annotations

KERNEL_GAP_S = 1e-6
HOST_PER_OP_S = 4e-6


def gpu_gaps_s(kernels: float) -> float:
    return kernels * KERNEL_GAP_S


def host_s(aten_ops: float) -> float:
    return aten_ops * HOST_PER_OP_S
