"""Kernel launch and host dispatch: what a step costs beyond its kernels' work.

    GPU side: back-to-back kernels on one stream leave a gap each (launch latency, block scheduling,
        tail): "cudaLaunchKernel ... ~1-3 us on CUDA 12+ drivers" (J. Lin, "From PyTorch op to kernel
        launch", lesson 18). Measured: (truth step time - the profiled kernels' GPU time) / kernels per
        step, benchmarks/truth/nvidia-h200.jsonl against benchmarks/truth/kernels/nvidia-h200.jsonl (user
        annotations left out): gpt2_small b8 bf16 2.82 us, fp32 2.33; vit_b16 b128 bf16 2.78; resnet50 b64
        bf16 2.38, fp32 2.57; decoder_1b b8 bf16 1.68: the median, 2.5 us, is the on-GPU gap.

    Host side: what runs in Python and C++ before the kernels are queued. The truth's step
        (gpuwise/step.py TrainStep.step, timed by gpuwise/measuring/runner.py _timed_steps between two CUDA
        events with `end.synchronize()` after each step) is: the batch's blocking pageable copy (transfer.py),
        forward under autocast, `loss.backward()`, `optimizer.step()`, `optimizer.zero_grad()`. So
        host = HOST_STEP_S                       once per step: the step's Python, the autograd engine's start
                                                 (backward runs on its CUDA device thread), torch.optim's
                                                 step()/zero_grad() wrappers (profile hooks, record_function,
                                                 param-group loops, _group_tensors_by_device_and_dtype)
             + HOST_PER_OP_S x traced ops        eager PyTorch spends "~5-25 us of CPU-side work per op" from
                                                 Python to the launch (J. Lin, same lesson, layer table); a
                                                 published H100 probe measured 4.2 us for "one operation issued
                                                 from Python". The trace counts several ops per Python call
                                                 (autograd, views, a fake tensor's prim.device), so 4 us per
                                                 traced op is taken, the lower end (not fitted)
             + HOST_PER_CONV_S x convolutions    more per cuDNN convolution call (forward or backward): the
                                                 cuDNN v8/v9 API builds a plan-cache key and a variant pack per
                                                 call; pytorch/pytorch#51390 timed one Conv2d(1, 1, 1) call from
                                                 Python at 52 us on the v8 API
        HOST_STEP_S and HOST_PER_CONV_S are fitted (`python benchmarks/fit_host.py`: least squares on the
        relative error, HOST_PER_OP_S held) on the host-bound truth records (measured step > 2x the predicted
        GPU time) of examples:mlp, examples:lenet, embedding, bert, examples:gpt-mini, gpt2_small b2 and
        resnet50 b16, H200 and H100 (69 records): 658 us and 87 us, median |err| of the fit 25.7 %. Checked
        on the others (convnet, examples:resnet, gpt2, vit_b16, bert_base, convnext_t, decoder_1b and every
        GPU-bound row): benchmarks/truth_speed.py. A per-op cost alone cannot fit both ends: examples:mlp
        b4096 (69 profiler aten ops, 21 kernels, 0.25 ms of GPU) took 1.07-1.41 ms. A per-op cost fitted as
        well (ops counted without prim.device) comes out at 18.5 us (median |err| of the fit 20.7 %), but
        the published HF bert-large bs1 ga4 rows
        (benchmarks/published_speed.py, V100) then run 35-39 % slow: their host is faster than the H200
        truth host (examples:mlp 0.68-0.95 ms on the H100 records' host against 0.71-1.24 ms), so the cited
        4 us is kept.

    The host runs ahead of the GPU only within a step (the step ends in a synchronize): `step_s` walks the
    phases in order, each ending when the host has issued it and the GPU has run it.
"""

from __future__ import annotations

from collections.abc import Mapping

KERNEL_GAP_S = 2.5e-6
HOST_STEP_S = 660e-6
HOST_PER_OP_S = 4e-6
HOST_PER_CONV_S = 87e-6
PHASES = ("forward", "backward", "optimizer")  # zero_grad runs with the optimizer's group (model.py)


def gpu_gaps_s(kernels: float) -> float:
    return kernels * KERNEL_GAP_S


def host_s(aten_ops: float) -> float:
    return aten_ops * HOST_PER_OP_S


def host_phases_s(host_ops: Mapping[str, float], conv_calls: Mapping[str, float] | None = None) -> dict[str, float]:
    """Host seconds per phase: each aten op's dispatch, each convolution's cuDNN set-up, and the step's fixed
    Python, which lands with the optimizer (torch.optim's step and zero_grad, the bulk of it)."""
    out = dict.fromkeys(PHASES, 0.0)
    for phase, ops in host_ops.items():
        out[phase if phase in PHASES else "optimizer"] += host_s(ops)
    for phase, calls in (conv_calls or {}).items():
        out[phase if phase in PHASES else "optimizer"] += calls * HOST_PER_CONV_S
    out["optimizer"] += HOST_STEP_S
    return out


def step_s(gpu: Mapping[str, float], host: Mapping[str, float], start_s: float = 0.0) -> float:
    """The GPU's finish time when the host issues the phases in order and the GPU runs each kernel once issued:
    a phase ends when both its kernels have run and its host work is done (the GPU cannot finish work not yet
    issued). `start_s`: where both timelines begin (the batch's blocking copy)."""
    h = g = start_s
    for phase in PHASES:
        h += host.get(phase, 0.0)
        g = max(g + gpu.get(phase, 0.0), h)
    return g
