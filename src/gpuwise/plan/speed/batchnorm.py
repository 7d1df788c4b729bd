"""Batch-norm time: not one streaming pass but several, at a bandwidth its kernels measurably do not reach.

Passes over the activation x (bytes of x each; the per-channel weights and statistics are negligible):
    forward, training   3: read x for the per-channel mean/variance, read x and write y to normalise
    forward, eval       2: read x, write y (running statistics)
    backward, training  5: read x and dy for the two per-channel sums (dy, dy * (x - mean)), then read x and
                        dy and write dx
    backward, eval      3: read x and dy, write dx
(PyTorch aten/src/ATen/native/cuda/Normalization.cuh: batch_norm_collect_statistics_kernel and
batch_norm_transform_input_kernel forward, batch_norm_backward_kernel reducing then writing grad_input.)

Which kernels run: PyTorch takes cuDNN's batch norm unless the input or weight is bfloat16, or the input is
fp16 with a non-fp32 weight, or the input has fewer than 3 dims (aten/src/ATen/native/Normalization.cpp,
`_select_batch_norm_backend`): a bf16 autocast step (bf16 activations, fp32 weights) runs PyTorch's own
kernels, fp32 and fp16 autocast run cuDNN's. PyTorch's channels-first kernels reduce each channel in one
thread block (`dim3 blocks(input.size(1))`): few blocks for the early, large layers, so they stay far below
the streaming bandwidth.

Achieved rate, measured per implementation (benchmarks/truth/kernels/nvidia-h200.jsonl, resnet50 b64 adamw,
NVIDIA H200: 132 SMs, 4.8 TB/s; torch 2.11, cuDNN of CUDA 13.0):
    native (bf16 run): batch_norm_collect_statistics + transform_input + backward + update_stats kernels
        14.52 ms per step for 53 layers, 8 passes of their 1.423 GB of bf16 activations = 11.38 GB:
        784 GB/s, 0.163 of the datasheet bandwidth
    cudnn (fp32 run): bn_fw_tr_1C11 + bn_bw_1C11 kernels 10.77 ms per step, 8 passes of 2.845 GB = 22.76 GB:
        2.11 TB/s, 0.440 of it
Both are far below what HBM gives, and the truth says what limits them: the same steps take the same time on
an H100 SXM (132 SMs, 3.35 TB/s) as on the H200 (resnet50 b64 adamw: bf16 36.4 vs 35.6 ms, fp32 86.2 vs
83.3 ms, benchmarks/truth/*.jsonl), so they are bound by the SMs' work (per-channel blocks, reductions), not by
DRAM. The rate is taken per SM (784 / 132 = 5.94 GB/s native, 2113 / 132 = 16.0 GB/s cuDNN) times the GPU's
SMs, never above its streaming bandwidth; SM clocks are not modelled.
PyTorch's channels-last kernels (a channels_last model in bf16) were not measured: priced at the streaming
efficiency of every other memory-bound kernel until a profile says otherwise.
"""

from __future__ import annotations

NATIVE, NATIVE_CHANNELS_LAST, CUDNN = "native", "native-channels-last", "cudnn"
BYTES_PER_S_PER_SM = {NATIVE: 11.38e9 / 14.52e-3 / 132, CUDNN: 22.76e9 / 10.77e-3 / 132}
PASSES = {("forward", True): 3, ("forward", False): 2, ("backward", True): 5, ("backward", False): 3}
_BACKWARD_INPUT_AT = {"aten.native_batch_norm_backward": 1, "aten.batch_norm_backward": 1,
                      "aten.cudnn_batch_norm_backward": 0, "aten.miopen_batch_norm_backward": 0}


def batch_norm_traffic(name: str, args: tuple) -> tuple[str, int]:
    """(implementation the GPU runs, bytes its passes move) for one batch-norm aten op of the trace."""
    import torch

    backward = name in _BACKWARD_INPUT_AT
    x = args[_BACKWARD_INPUT_AT[name]] if backward else args[0]
    weight = args[2] if backward else args[1]
    flags = [a for a in args[1:] if isinstance(a, bool)]
    training = flags[0] if flags else True  # _batch_norm_with_update, cudnn backward: training only
    if not isinstance(x, torch.Tensor):
        return NATIVE, 0
    wdtype = weight.dtype if isinstance(weight, torch.Tensor) else x.dtype
    if "cudnn" in name or (x.dim() >= 3 and torch.bfloat16 not in (x.dtype, wdtype)
                           and (x.dtype != torch.float16 or wdtype == torch.float32)):
        impl = CUDNN
    elif x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        impl = NATIVE_CHANNELS_LAST
    else:
        impl = NATIVE
    nbytes = x.numel() * x.element_size()
    return impl, PASSES[("backward" if backward else "forward", bool(training))] * nbytes


def batch_norm_s(nbytes: float, impl: str, sm_count: int, bandwidth: float, memory_efficiency: float) -> float:
    """Seconds for `nbytes` of batch-norm passes run by `impl` on `sm_count` SMs (module docstring)."""
    if nbytes <= 0 or bandwidth <= 0:
        return 0.0
    streaming = bandwidth * memory_efficiency
    per_sm = BYTES_PER_S_PER_SM.get(impl)
    return nbytes / (min(per_sm * sm_count, streaming) if per_sm else streaming)
