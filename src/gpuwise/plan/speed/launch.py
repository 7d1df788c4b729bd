"""Kernel launch and host dispatch: what a step costs beyond its kernels' work.

    GPU side: back-to-back kernels on one stream leave a gap each (launch latency, block scheduling,
        tail): "cudaLaunchKernel ... ~1-3 us on CUDA 12+ drivers" (J. Lin, "From PyTorch op to kernel
        launch", lesson 18). Measured: (truth step time - the profiled kernels' GPU time) / kernels per
        step, benchmarks/truth/nvidia-h200.jsonl against benchmarks/truth/kernels/nvidia-h200.jsonl (user
        annotations left out): gpt2_small b8 bf16 2.82 us, fp32 2.33; vit_b16 b128 bf16 2.78; resnet50 b64
        bf16 2.38, fp32 2.57; decoder_1b b8 bf16 1.68: the median, 2.5 us, is the on-GPU gap.
    Host side: eager PyTorch spends "~5-25 us of CPU-side work per op" from Python to the launch
        (same source, layer table); a published H100 probe measured 4.2 us for "one operation issued
        from Python". The trace counts aten ops, several per Python call (autograd, views), so 4 us
        per aten op is taken (the lower end), views included.
The host runs ahead of the GPU asynchronously, so a step costs max(GPU time, host time): the host
shows only when the GPU outruns it (small models, small batches).
"""

from __future__ import annotations

KERNEL_GAP_S = 2.5e-6
HOST_PER_OP_S = 4e-6


def gpu_gaps_s(kernels: float) -> float:
    return kernels * KERNEL_GAP_S


def host_s(aten_ops: float) -> float:
    return aten_ops * HOST_PER_OP_S
