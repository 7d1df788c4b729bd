"""Setting up gpuwise's training step for a trace: the model, the warm-up, CUDA's optimizer defaults.

Fake tensors need a few things done differently from a real process, without changing what the step
allocates: a model whose initialisation reads data is built for real and copied into fake tensors;
`Module.to()` cannot swap fake parameters while FakeTensorMode holds weakrefs to them, so the model is
moved by hand; the warm-up can create the optimizer state without a first forward/backward; and
CPU tensors that stand for CUDA ones get CUDA's foreach optimizer default.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc

from ... import optional_libs
from ...errors import first_line
from ...step import StepConfig, TrainStep, enable_checkpointing, warm_optimizer
from .fallback import check_fits_in_ram, is_fake_limit

WARMUPS = ("optimizer", "step", "copy")  # "copy": plan/memory/warmup.py


@contextlib.contextmanager
def before_forks(modes, configs):
    """Inside: this process is ready to be forked for traces with these training modes and step configs, so
    that no fork does on its own, in its first trace, what all of them would: the libraries those traces
    import (peft, and under it bitsandbytes, imported as a trace imports them, with torch.compile deferred:
    optional_libs.imported; outside any fake mode and untraced), what peft builds once
    per process (`_conversion_mapping`) and the optimizers' once-per-process state (`warm_optimizer`) are
    made here, once; and the objects alive now are frozen out of the garbage collector's view (`gc.freeze`), so that a full collection in a fork neither walks nor
    copies (copy-on-write) the parent's heap. The garbage is collected first only where the collector runs:
    under `fit` it is paused (forks included), and that collection alone took ~0.33 s of the parent's time
    before each prefetch of a 7B fit. Nothing a trace records changes: tests/test_plan_fit.py."""
    if any(m.adapters for m in modes) and optional_libs.available("peft"):
        optional_libs.imported("peft")
        _conversion_mapping()
    if any(m.qlora for m in modes) and optional_libs.available("bitsandbytes"):
        optional_libs.imported("bitsandbytes")
    for config in configs:
        if config.optimizer is not None:
            warm_optimizer(config.optimizer)
    if gc.isenabled():
        gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _conversion_mapping() -> None:
    """transformers' table of checkpoint weight renamings for every model type, which peft's LoRA injection
    reads (`get_model_conversion_mapping`): built once per process on first use, ~0.3 s of regex compiles
    that every fork's first LoRA trace paid (fit examples/configs/llama-2-7b.json --gpu rtx4090, cProfile of a
    fork's 4-block trace). Built here instead; nothing where this transformers has no such table."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    except ImportError:
        return
    get_checkpoint_conversion_mapping("llama")


def build_model_for_trace(workload, fake_mode, mode):
    """The workload's model: built under fake tensors, or, when its construction needs real data
    (e.g. initialisers calling `.item()`), built with real weights and copied into fake tensors."""
    if fake_mode is None:
        return workload.build_model()
    before = len(mode.rec.events), len(mode.rec.blocks)
    try:
        with sampling_without_data():
            return workload.build_model()
    except Exception as exc:  # noqa: BLE001 - only fake-tensor limits are handled here
        if not is_fake_limit(exc):
            raise
        why = f"the model's initialisation reads data ({type(exc).__name__}: {first_line(exc)[:160]})"
    mode.forget_since(*before)  # the failed build's storages (a partly built model) are not the run's
    check_fits_in_ram(workload, why, copies=1)
    import copy

    from torch._subclasses.fake_tensor import FakeCopyMode, unset_fake_temporarily

    with unset_fake_temporarily(), mode.paused():
        real = workload.build_model()
    memo: dict = {}
    # the copy is not traced: its storages are registered where the trace registers what it did not make
    # (trace.py `_label(..., create=True)`), in the model's parameter order, a block at a time, as the rebuild of
    # repeated blocks needs (traced, the copy's per-tensor temporaries split each block's run into pieces)
    with FakeCopyMode(fake_mode), mode.paused():
        model = copy.deepcopy(real, memo)
        # Parameter.__deepcopy__ drops a parameter's Python attributes (bitsandbytes' 4-bit weights keep their
        # quant_state there, whose absmax the module also holds as buffers): copied too, their tensors the copies
        for (_, p), (_, q) in zip(real.named_parameters(remove_duplicate=False),
                                  model.named_parameters(remove_duplicate=False)):
            lost = {k: v for k, v in vars(p).items() if not hasattr(q, k)}
            if lost:
                vars(q).update(copy.deepcopy(lost, memo))
    mode.notes.append("model built with real weights (its initialisation reads data), then traced with fake tensors")
    return model


@contextlib.contextmanager
def sampling_without_data():
    """Inside: `torch.nn.init.trunc_normal_` fills its tensor in place by the inverse CDF, as torch up to 2.12
    did (uniform_, erfinv_, mul_, add_, clamp_), so that fake tensors can build a model that calls it.
    torch 2.13 samples by rejection instead: it loops `while ... mask.any()`, reading the data, which fake
    tensors cannot, so every model whose initialisation truncates a normal (transformers' ViT, Swin, DeiT,
    SigLIP and what embeds it: Gemma 3, PaliGemma, ...; 48 modeling files) was built with real weights, and
    refused as "cannot tell" where they would not fit in host memory (a Gemma-3-4B). What is built is the
    same either way: the same parameters, filled in place; a rejection round's temporaries are the
    initialiser's, freed before the step, and the build with real weights did not trace them either."""
    from torch.nn import init

    torch_own = getattr(init, "_no_grad_trunc_normal_", None)
    if torch_own is None:
        yield
        return
    init._no_grad_trunc_normal_ = _trunc_normal_in_place
    try:
        yield
    finally:
        init._no_grad_trunc_normal_ = torch_own


def _trunc_normal_in_place(tensor, mean: float, std: float, a: float, b: float, generator=None):
    """torch 2.12's `_no_grad_trunc_normal_` (torch/nn/init.py): a normal truncated to [a, b] by its inverse CDF."""
    import math

    import torch

    def norm_cdf(x: float) -> float:
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    with torch.no_grad():
        low, high = norm_cdf((a - mean) / std), norm_cdf((b - mean) / std)
        tensor.uniform_(2 * low - 1, 2 * high - 1, generator=generator)
        tensor.erfinv_()
        tensor.mul_(std * math.sqrt(2.0))
        tensor.add_(mean)
        tensor.clamp_(min=a, max=b)
        return tensor


def warm_up_optimizer(step: TrainStep) -> None:
    """What the first step leaves behind, without its forward and backward: every trainable
    parameter gets a gradient, the optimizer steps (creating its state) and the gradients are freed;
    a GradScaler gets its scale and growth tracker. WARMUPS["step"] runs a whole step instead."""
    import torch

    for group in step.optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
    if step.scaler is not None:
        step.scaler.scale(torch.zeros((), device=step.device))
    step.optimizer.step()
    step.optimizer.zero_grad(set_to_none=step.config.zero_grad == "none")


@contextlib.contextmanager
def foreach_by_default():
    """torch.optim picks foreach by default for CUDA parameters (optimizer.py `_default_to_fused_or_foreach`,
    from `_get_foreach_kernels_supported_devices`): let CPU tensors standing for CUDA ones get the same."""
    import torch.optim.optimizer as opt_mod
    import torch.utils._foreach_utils as fu
    from torch._subclasses.fake_tensor import FakeTensor

    saved = fu._get_foreach_kernels_supported_devices
    devices = list(saved()) + ["cpu"]
    fu._get_foreach_kernels_supported_devices = lambda: devices
    saved_opt = getattr(opt_mod, "_get_foreach_kernels_supported_devices", None)
    if saved_opt is not None:
        opt_mod._get_foreach_kernels_supported_devices = fu._get_foreach_kernels_supported_devices
    types = getattr(opt_mod, "_foreach_supported_types", [])
    added = FakeTensor not in types  # fake parameters stand for real ones, which qualify
    if added:
        types.append(FakeTensor)
    try:
        yield
    finally:
        fu._get_foreach_kernels_supported_devices = saved
        if saved_opt is not None:
            opt_mod._get_foreach_kernels_supported_devices = saved_opt
        if added:
            types.remove(FakeTensor)


@contextlib.contextmanager
def dropout_as_cuda_runs_it():
    """`F.dropout` as it runs on CUDA tensors: aten's `dropout` takes the fused kernel there
    (Dropout.cpp `is_fused_kernel_acceptable`: a CUDA input, 0 < p < 1), `native_dropout`, which saves a
    bool mask (1 byte an element) for backward; on CPU tensors it decomposes into a noise tensor of the
    input's dtype (4 bytes in fp32) that `mul` saves. The in-place form (`inplace=True`, `_dropout<true>`)
    takes the noise path on CUDA too and is left alone. Replaced at module level, as the recompute under
    activation checkpointing looks it up there too."""
    import torch
    import torch.nn.functional as F

    original = F.dropout

    def dropout(input, p=0.5, training=True, inplace=False):
        plain = isinstance(input, torch.Tensor) and (type(input) in (torch.Tensor, torch.nn.Parameter)
                                                     or is_fake(input))  # not other subclasses
        if training and not inplace and 0.0 < p < 1.0 and plain and input.numel() > 0:
            return torch.ops.aten.native_dropout(input, p, True)[0]
        return original(input, p, training, inplace)

    F.dropout = dropout
    try:
        yield
    finally:
        F.dropout = original


def is_fake(t) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def fake_train_step(workload, config: StepConfig, model) -> TrainStep:
    """TrainStep on a fake model: move it ourselves (Module.to swaps fake parameters, which fails when
    FakeTensorMode holds a weakref to them), keeping tied parameters tied, then let TrainStep's own
    `.to()` calls be no-ops."""
    import torch

    if config.checkpointing:  # wrap blocks before moving, as TrainStep does
        enable_checkpointing(model, "selective" if config.checkpointing == "selective" else "full")
        config = dataclasses.replace(config, checkpointing=False)
    dtype = torch.bfloat16 if config.precision == "bf16-pure" else None
    memo: dict[int, torch.Tensor] = {}

    def move(t, is_param: bool):
        if id(t) not in memo:
            with torch.no_grad():
                new = t.to(dtype) if dtype is not None and t.is_floating_point() else t
            if is_param:  # a new Parameter keeps the old one's attributes (bitsandbytes' quant_state, ...)
                new = torch.nn.Parameter(new, requires_grad=t.requires_grad)
                new.__dict__.update(t.__dict__)
            memo[id(t)] = new
        return memo[id(t)]

    for m in model.modules() if dtype is not None else ():
        for k, p in m._parameters.items():
            if p is not None:
                m._parameters[k] = move(p, True)
        for k, b in m._buffers.items():
            # not bitsandbytes' quant state (registered as buffers only to be counted, quant4bit.py): a real
            # model.to(bf16) leaves it in the dtypes bitsandbytes made, and the layer keeps using those
            if b is not None and not k.startswith("quant_state_"):
                m._buffers[k] = move(b, False)
    model.to = lambda *a, **k: model
    try:
        return TrainStep(workload, config, device="cpu", model=model)
    finally:
        del model.to
