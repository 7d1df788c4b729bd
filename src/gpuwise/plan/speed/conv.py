"""Convolution time: cuDNN runs a convolution as an implicit GEMM, so it is priced like one (gemm.py): the
larger of its FLOPs at the matmul efficiency and its bytes at the achievable bandwidth (NVIDIA,
"Convolutional Layers User's Guide", docs.nvidia.com/deeplearning/performance/dl-performance-convolutional:
the implicit-GEMM mapping, and arithmetic intensity deciding math- or memory-limited layers).

    precision   a 2-byte operand runs on bf16/fp16 tensor cores; a 4-byte one on TF32 tensor cores only
                under `--precision tf32`: gpuwise's fp32 step turns `torch.backends.cudnn.allow_tf32` off
                (step.tf32_mode), as it does for matmuls, although torch's own default for convolutions is
                on (PyTorch docs, CUDA semantics, "TensorFloat-32 (TF32) on Ampere (and later) devices").
                Without tensor cores (fp32, TF32 off) cuDNN runs FFMA kernels (sm80_xmma_*_ffma, dgrad_engine,
                wgrad_alg0, FFT and Winograd ones), which reach far less of the fp32 peak than GEMMs reach of
                theirs: FP32_CONV_EFFICIENCY, measured (benchmarks/truth/kernels/nvidia-h200.jsonl, resnet50
                b64 adamw fp32, NVIDIA H200, fp32 peak 67 TFLOP/s): the conv + GEMM kernel classes less the
                cuDNN batch-norm kernels (bn_fw_tr_1C11, bn_bw_1C11: 10.77 ms) and layout transposes (0.79 ms)
                = 64.60 + 4.48 - 11.56 = 57.51 ms per step for the 1.554 TFLOP of the step's convolutions
                (forward 0.523 + backward 1.031, as traced; the fc layer's 0.8 GFLOP left in) -> 27.0 TFLOP/s,
                0.403 of the peak. Hopper only: those kernels are sm80 builds and pre-tensor-core engines
                (the profile's names), not Hopper's own; on a V100-SXM2 the same fp32 NCHW ResNet-50 step
                (batch 128, 342 ms, github.com/sandeepkumar-skb/pytorch_experiments torchvision_exp) is
                within 1 % of the matmul efficiency's price (README), so other architectures keep it.
    layout      tensor cores take NHWC; with torch's default NCHW tensors "the NCHW tensor must be
                transposed to NHWC before the convolution and transposed back to NCHW after" (MosaicML
                Composer, "Channels Last" method card, from NVIDIA's diagram; "every time a convolution
                operation is called ... the cuDNN library performs a transpose"): each channels-first
                activation the call touches is read and written once more. A channels_last model pays none.
"""

from __future__ import annotations

from .memory_bound import memory_bound_s

FP32_CONV_EFFICIENCY = {"hopper": 0.403}


def conv_s(flops: float, nbytes: float, nchw_bytes: float, itemsize: int, half_peak: float, tf32_peak: float,
           fp32_peak: float, matmul_efficiency: float, bandwidth: float, memory_efficiency: float,
           arch: str = "") -> float:
    """Seconds for one convolution call (forward, or one backward call computing its input and weight grads)."""
    tensor_cores = itemsize <= 2 or tf32_peak > 0
    peak = half_peak if itemsize <= 2 else (tf32_peak or fp32_peak)
    efficiency = matmul_efficiency if tensor_cores else FP32_CONV_EFFICIENCY.get(arch, matmul_efficiency)
    compute_s = flops / (peak * efficiency) if peak else 0.0
    memory_s = memory_bound_s(nbytes, bandwidth, memory_efficiency)
    transpose_s = memory_bound_s(2 * nchw_bytes, bandwidth, memory_efficiency) if tensor_cores else 0.0
    return max(compute_s, memory_s) + transpose_s
