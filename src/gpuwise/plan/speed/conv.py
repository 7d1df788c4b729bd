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
                With tensor cores (bf16/fp16) Hopper's cuDNN runs its own sm90_xmma fprop/dgrad/wgrad
                implicit-GEMM kernels, still far from the GEMM efficiency on a CNN's many small layers (few
                channels: partial tiles; the wgrad split over N x H x W and reduced): HALF_CONV_EFFICIENCY,
                same profile, resnet50 b64 adamw bf16: the conv + GEMM kernel classes less cuDNN's layout
                transposes (nchwToNhwcKernel 2.361 ms, nhwcToNchwKernel 0.963 ms, priced apart below) =
                6.50 + 2.41 - 3.32 = 5.59 ms per step for the same 1.554 TFLOP -> 278 TFLOP/s, 0.281 of the
                989.5 dense bf16 peak. Hopper only, measured there; other architectures keep the matmul efficiency
                their GEMMs of the same operands take (catalog.py SpeedSpec.gemm_efficiency: on a B200 or GB200
                the sustained MSMF for 2-byte operands, as its GEMMs; a conv-heavy step saturates the card's power
                as a GEMM-heavy one does).
    layout      tensor cores take NHWC; with torch's default NCHW tensors "the NCHW tensor must be
                transposed to NHWC before the convolution and transposed back to NCHW after" (MosaicML
                Composer, "Channels Last" method card, from NVIDIA's diagram; "every time a convolution
                operation is called ... the cuDNN library performs a transpose"): each channels-first
                activation the call touches is read and written once more. A channels_last model pays none.

Depthwise convolutions (one input channel per group, plan/speed/ops.py _depthwise) are no GEMM: each output
element is a dot product of kernel-taps length (49 for 7x7), so there is no K to feed tensor cores. cuDNN runs
direct kernels on the CUDA cores (conv2d_c1_k1_nhwc forward, dgrad2d_c1_k1_nhwc_specialized data gradient,
wgrad2d_c1_k1_nhwc + _reduce or, in fp32, wgrad2d_grouped_direct_kernel weight gradient), which reach a small
fraction of the fp32 (FFMA) peak and far less than their bandwidth (fp32 forward: 0.39 TB/s of 4.8). Priced
per kernel: FLOPs (2 x output elements x taps, the forward's, for each pass) at DEPTHWISE_EFFICIENCY of the
fp32 peak, or its bytes at the achievable bandwidth if longer. Measured (benchmarks/truth/kernels/
nvidia-h200.jsonl, convnext_t b32 adamw, NVIDIA H200, fp32 peak 67 TFLOP/s, cuDNN's kernels per step for the
18 depthwise 7x7 convolutions, 6.727 GFLOP per pass as traced):
    fp32    forward 1.408 ms (18 calls) + data gradient 1.398 ms (18) = 2 x 6.727 GFLOP in 2.806 ms: 4.79 TFLOP/s,
            0.0716 of the peak; weight gradient wgrad2d_grouped_direct_kernel 25.52 ms (18): 0.264 TFLOP/s, 0.00393
    bf16    forward 0.738 + data 1.208 + weight 0.533 + its reduce 0.056 ms = 3 x 6.727 GFLOP in 2.535 ms:
            7.96 TFLOP/s, 0.119 (per pass 0.136 / 0.083 / 0.171: one rate, not three)
Only aggregates per kernel name were profiled, so time is taken proportional to FLOPs across the stages'
shapes (an assumption). Other GPUs take the same fractions of their fp32 peak, and NCHW fp32 inputs, which torch
sends to its own conv_depthwise2d kernels rather than cuDNN's, the same rates: assumptions, measured on the H200
with cuDNN's channels-last kernels only.
"""

from __future__ import annotations

from .memory_bound import memory_bound_s

FP32_CONV_EFFICIENCY = {"hopper": 0.403}
HALF_CONV_EFFICIENCY = {"hopper": 0.281}  # 2-byte operands on tensor cores (TF32 keeps the matmul efficiency)
# depthwise: fraction of the fp32 peak by operand itemsize; the fp32 weight gradient's own kernel apart
DEPTHWISE_EFFICIENCY = {4: 0.0716, 2: 0.119}
DEPTHWISE_FP32_WEIGHT_GRAD_EFFICIENCY = 0.00393


def conv_s(flops: float, nbytes: float, nchw_bytes: float, itemsize: int, half_peak: float, tf32_peak: float,
           fp32_peak: float, matmul_efficiency: float, bandwidth: float, memory_efficiency: float,
           arch: str = "") -> float:
    """Seconds for one convolution call (forward, or one backward call computing its input and weight grads)."""
    tensor_cores = itemsize <= 2 or tf32_peak > 0
    peak = half_peak if itemsize <= 2 else (tf32_peak or fp32_peak)
    efficiency = matmul_efficiency if tensor_cores else FP32_CONV_EFFICIENCY.get(arch, matmul_efficiency)
    if itemsize <= 2:
        efficiency = HALF_CONV_EFFICIENCY.get(arch, matmul_efficiency)
    compute_s = flops / (peak * efficiency) if peak else 0.0
    memory_s = memory_bound_s(nbytes, bandwidth, memory_efficiency)
    transpose_s = memory_bound_s(2 * nchw_bytes, bandwidth, memory_efficiency) if tensor_cores else 0.0
    return max(compute_s, memory_s) + transpose_s


def depthwise_s(flops: float, nbytes: float, pass_: str, itemsize: int, fp32_peak: float, bandwidth: float,
                memory_efficiency: float) -> float:
    """Seconds for one depthwise convolution kernel: `pass_` "forward", "data" or "weight" (gradient)."""
    efficiency = DEPTHWISE_EFFICIENCY[4 if itemsize >= 4 else 2]
    if pass_ == "weight" and itemsize >= 4:
        efficiency = DEPTHWISE_FP32_WEIGHT_GRAD_EFFICIENCY
    compute_s = flops / (fp32_peak * efficiency) if fp32_peak else 0.0
    return max(compute_s, memory_bound_s(nbytes, bandwidth, memory_efficiency))
