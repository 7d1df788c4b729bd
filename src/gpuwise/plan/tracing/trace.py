"""Trace one steady-state training step into memory events, without real memory (fake tensors).

The step is `gpuwise.step.TrainStep`'s own: the model and optimizer are built on the target device,
one warm-up step creates the optimizer state, then the steady step (forward, loss, backward,
optimizer.step, zero_grad(set_to_none=True)) is the one the peak is read from. Every tensor an aten op
creates on the target device is followed by its storage: views share it, it is counted once, and it is
freed when its last reference dies (a weakref on the fake tensor's untyped storage, as
torch.distributed._tools.mem_tracker does): the dispatch mode that sees every op is plan/tracing/dispatch.py's.
Memory kernels take below the dispatcher comes from the registry in `plan/tracing/kernels.py`; FLOPs of the
steady step come from torch.utils.flop_counter's formulas in the same pass.

When the fake trace cannot run (a data-dependent op, an op with no fake kernel, an abort on a
CPU-only build), `plan/tracing/fallback.py` gets an estimate another way and says which in `method`.
"""

from __future__ import annotations

import contextlib

from ...errors import GpuwiseError
from ...step import StepConfig, TrainStep, tensors_in, warm_optimizer
from ...workload import load_workload
from ..memory.events import MemEvent, MemoryTrace, check_target
from ..memory.warmup import DeferredWarmUp, NotCopyable, warm_up_step_from_steady
from ..speed.ops import OpCosts
from .accumulation import node_prehooks
from .compiled import compiled_notes
from .cuda_autocast import cuda_autocast_policy
from .cudnn_rnn import rnn_as_gpu_runs_it
from .dispatch import TraceMode
from .fallback import trace_with_fallback
from .repeat_tags import ONE, LayerTags, Units
from .scope import ModuleScope
from .sdpa import (
    active_target,
    attention_note,
    attention_target,
    builtin_sdpa_caught,
    padding_read_from_batch,
    sdpa_as_gpu_runs_it,
    set_attn_implementation,
)
from .setup import (
    WARMUPS,
    build_model_for_trace,
    dropout_as_cuda_runs_it,
    fake_train_step,
    foreach_by_default,
)
from .stochastic import every_layer_runs
from .torch_versions import SOFTMAX_NOTE, softmax_saves_input


def _storages(obj, device_type: str):
    """Untyped storages of every tensor in a (nested) batch / state structure on `device_type`."""
    return [t.untyped_storage() for t in tensors_in(obj) if t.device.type == device_type]


def _label(mode: TraceMode, objs, category: str, create: bool = False) -> None:
    """Set the category of these tensors' blocks; `create` registers storages no traced op made."""
    for st in _storages(objs, mode.device_type):
        entry = mode.live.get(id(st))
        if entry is None and create and st.nbytes():
            mode.alloc(st.nbytes(), "(built outside the trace)", st)
            entry = mode.live.get(id(st))
        if entry is not None and not mode.rec.blocks[entry[0]].category:
            mode.rec.blocks[entry[0]].category = category


@contextlib.contextmanager
def _phase_hooks(mode: TraceMode, step: TrainStep):
    """Mark optimizer and zero_grad phases, and label gradients and optimizer state as they appear."""
    opt = step.optimizer
    params = [p for g in opt.param_groups for p in g["params"]]

    def pre(*_a, **_k):
        _label(mode, [p.grad for p in params if p.grad is not None], "gradients")
        mode.phase = "optimizer"

    def post(*_a, **_k):
        _label(mode, [list(s.values()) for s in opt.state.values()], "optimizer_state")

    h1, h2 = opt.register_step_pre_hook(pre), opt.register_step_post_hook(post)
    original_zero_grad = opt.zero_grad

    def zero_grad(*a, **k):
        _label(mode, [p.grad for p in params if p.grad is not None], "gradients")
        mode.phase = "zero_grad"
        return original_zero_grad(*a, **k)

    opt.zero_grad = zero_grad
    scaler_step = None
    if step.scaler is not None:
        scaler_step = step.scaler.step

        def guarded_step(*a, **k):  # found_inf.item(): fake tensors have no data; grads are finite
            mode.item_default = 0.0
            try:
                return scaler_step(*a, **k)
            finally:
                mode.item_default = None

        step.scaler.step = guarded_step
    try:
        yield
    finally:
        h1.remove()
        h2.remove()
        del opt.zero_grad
        if scaler_step is not None:
            del step.scaler.step


def _blocks_of(mode: TraceMode, objs) -> list[int]:
    """The blocks of these tensors' storages (None for a storage the trace does not hold)."""
    return [entry[0] if (entry := mode.live.get(id(st))) is not None else None
            for st in _storages(objs, mode.device_type)]


@contextlib.contextmanager
def _scaler_made_uncounted(mode: TraceMode, scaler):
    """A GradScaler's first `scale` makes its scale and growth tracker (`_lazy_init_scale_growth_tracker`):
    with a copied warm-up (plan/memory/warmup.py) the traced step is the scaler's first, and those two
    allocations move into the warm-up step; they are the first step's ops, not the steady step's (the speed
    model's ops and FLOPs leave them out, as a traced warm-up step does)."""
    if scaler is None:
        yield
        return
    lazy = scaler._lazy_init_scale_growth_tracker

    def uncounted(*a, **k):
        counting, mode.count_flops = mode.count_flops, False
        try:
            return lazy(*a, **k)
        finally:
            mode.count_flops = counting

    scaler._lazy_init_scale_growth_tracker = uncounted
    try:
        yield
    finally:
        del scaler._lazy_init_scale_growth_tracker


def _settle(mode: TraceMode) -> list[MemEvent]:
    """Turn the raw events into MemEvents, with each block's category decided from what it became."""
    out = []
    for action, block, phase, module, op, _layer in mode.rec.events:
        b = mode.rec.blocks[block]
        if not b.category:
            if b.phase == "setup":
                b.category = "temporary" if b.freed else "buffers"
            elif b.phase == "forward":
                b.category = "activations" if block in mode.saved else "temporary"
            else:
                b.category = "temporary"
        out.append(MemEvent(action, block, b.nbytes, b.category, phase, module, op))
    return out


def run_fake(workload, batch_size: int, config: StepConfig, target: str, warmup: str = "optimizer") -> MemoryTrace:
    """Trace with fake tensors (no memory is used)."""
    return _run(workload, batch_size, config, target, fake=True, warmup=warmup)


def run_real(workload, batch_size: int, config: StepConfig, target: str, warmup: str = "optimizer") -> MemoryTrace:
    """Trace the same step on real CPU tensors (data-dependent ops just run); sizes stand for `target`."""
    trace = _run(workload, batch_size, config, target, fake=False, warmup=warmup)
    trace.method = "real-trace"
    return trace


def _run(workload, batch_size: int, config: StepConfig, target: str, fake: bool,
         warmup: str = "optimizer", layers: int | None = None, units: Units = ONE) -> MemoryTrace:
    """`_trace_once`; a warm-up step that cannot be copied from the steady one (plan/memory/warmup.py) is traced."""
    if (config.zero_grad == "zeros" or config.keep_last_loss) and warmup in ("copy", "optimizer"):
        warmup = "step"  # the first step leaves every gradient (or its loss's graph) allocated: trace it whole
    if warmup == "copy":
        try:
            return _trace_once(workload, batch_size, config, target, fake, "copy", layers, units)
        except NotCopyable:
            warmup = "step"
    return _trace_once(workload, batch_size, config, target, fake, warmup, layers, units)


class _SdpaCaughtInForward:
    """The step's workload, whose forward and loss (`compute_loss`) run with builtin SDPA calls caught
    (sdpa.builtin_sdpa_caught): only there does attention run, so the torch-function mode that takes every
    torch call through Python is left out of the model's construction, the optimizer and zero_grad."""

    def __init__(self, workload):
        self._workload = workload

    def __getattr__(self, name):
        return getattr(self._workload, name)

    def compute_loss(self, model, batch):
        with builtin_sdpa_caught():
            return self._workload.compute_loss(model, batch)


def _real_batch(mode: TraceMode, workload, batch_size: int):
    """The batch built for real (not traced): read where the real run reads values (sdpa.padding_read_from_batch)."""
    with mode.paused():
        return workload.build_batch(batch_size)


def _trace_once(workload, batch_size: int, config: StepConfig, target: str, fake: bool,
                warmup: str = "optimizer", layers: int | None = None, units: Units = ONE) -> MemoryTrace:
    """The tracer. Tensors are CPU tensors (fake or real) standing for `target`'s: autograd on fake CUDA
    tensors aborts a CPU-only torch (no CUDA device guard), so what differs on CUDA is emulated instead:
    attention runs the kernel the GPU would pick (plan/tracing/sdpa.py), optimizers default to foreach as on
    CUDA, and kernel workspaces come from the target's registry entries. `layers`: the model has that
    many repeated blocks in one ModuleList; each event is tagged with the unit of blocks it belongs to (`units`:
    a block each by default) (`trace.layers`, read by plan/tracing/repeat.py)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    tracker = ModuleScope()
    mode = TraceMode(target, tracker)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    cuda_like = target == "cuda"
    with fake_mode, tracker, mode, contextlib.ExitStack() as stack:
        attn = active_target() or stack.enter_context(attention_target())  # the estimate's GPU, else sm80
        if cuda_like:
            stack.enter_context(sdpa_as_gpu_runs_it(catch_builtin=False))  # caught in the forward only
            stack.enter_context(foreach_by_default())
            stack.enter_context(dropout_as_cuda_runs_it())
            stack.enter_context(rnn_as_gpu_runs_it())
            if config.precision in ("fp16", "bf16"):
                stack.enter_context(cuda_autocast_policy())
        stack.enter_context(softmax_saves_input(config.softmax_saves_input))
        if config.softmax_saves_input:
            mode.notes.append(SOFTMAX_NOTE)
        stack.enter_context(node_prehooks(mode.sums, lambda: len(mode.rec.blocks)))
        with mode.following_construction() if layers is not None else contextlib.nullcontext():
            model = build_model_for_trace(workload, fake_mode if fake else None, mode)
        tracker.name_from(model)
        attn_note = set_attn_implementation(model, attn)
        if attn_note:
            mode.notes.append(attn_note)
        mode.notes.extend(stack.enter_context(every_layer_runs(model)) + compiled_notes(model))
        if layers is not None:
            mode.layers = LayerTags.follow(mode, model, layers, units)
            if mode.layers is not None:
                mode.middle = OpCosts()
        step = fake_train_step(workload, config, model) if fake else TrainStep(workload, config, "cpu", model)
        made_at = len(mode.rec.events)  # the optimizer is the last thing the step makes (optimizer_swap.py)
        if cuda_like:
            step.workload = _SdpaCaughtInForward(step.workload)
        host_batch = workload.build_batch(batch_size)
        # each step copies it to the GPU (plan/speed/transfer.py)
        mode.costs.input_bytes["forward"] += sum(t.numel() * t.element_size() for t in tensors_in(host_batch))
        batch = step.to_device(host_batch)
        del host_batch
        _label(mode, list(step.model.parameters()), "parameters", create=True)
        _label(mode, list(step.model.buffers()), "buffers", create=True)
        if mode.layers is not None:  # after the storages built outside the trace (adapters' models) exist
            mode.layers.tag_parameters(mode, step.model)
        _label(mode, batch, "inputs", create=True)
        if cuda_like and fake:
            stack.enter_context(padding_read_from_batch(batch, lambda: _real_batch(mode, workload, batch_size)))
        deferred = None
        if warmup in ("optimizer", "copy"):
            if step.scaler is not None and warmup == "optimizer":  # the scale and growth tracker a first
                step.scaler.scale(torch.zeros((), device=step.device))  # step leaves behind
            deferred = DeferredWarmUp(mode, step, len(mode.rec.events))
        else:
            mode.phase = "forward"
            with _phase_hooks(mode, step):
                step.step(batch, on_device=True)
        steady_start = len(mode.rec.events)
        mode.phase = "forward"
        mode.count_flops = True
        with deferred or contextlib.nullcontext(), _phase_hooks(mode, step), \
                _scaler_made_uncounted(mode, step.scaler if warmup == "copy" else None):
            step.step(batch, on_device=True)
        mode.count_flops = False
        if deferred is not None and warmup == "copy":
            scaler = None if step.scaler is None else \
                _blocks_of(mode, [step.scaler._scale, step.scaler._growth_tracker])
            steady_start = warm_up_step_from_steady(mode, deferred, scaler)
        elif deferred is not None:
            steady_start += deferred.splice()
        if step.scaler is not None:
            _label(mode, [step.scaler._scale, step.scaler._growth_tracker], "optimizer_state")
        _label(mode, [list(s.values()) for s in step.optimizer.state.values()], "optimizer_state")
        flops = mode.flops
        events = _settle(mode)
        if mode.layers is not None:
            mode.layers.tag_optimizer_state(mode, step.optimizer)
        tags = None if mode.layers is None else mode.layers.finish(mode.rec.events)
        del step, batch, model
    trace = MemoryTrace(events, steady_start, target, "fake-trace", notes=list(mode.notes), flops_per_step=flops)
    trace.layers = tags
    trace.optimizer_made_at = made_at
    trace.op_costs = mode.costs
    trace.middle_costs, trace.middle_flops = mode.middle, mode.middle_flops
    if cuda_like:
        trace.notes.append(attention_note(attn))
        trace.notes.append("cuda: traced on CPU tensors with CUDA's attention kernels and optimizer defaults"
                           + ("; autocast applies CUDA's cast policy (plan/tracing/cuda_autocast.py)"
                              if config.precision in ("fp16", "bf16") else ""))
    return trace


def trace_step(workload, batch_size: int, config: StepConfig | None = None, target: str = "cpu",
               *, fallback: bool = True, warmup: str | None = None, layers: int | None = None,
               units: Units = ONE) -> MemoryTrace:
    """Trace setup, a warm-up step and the steady-state step of `workload` at `batch_size` on `target`.

    Returns the events (`events[steady_start:]` is the steady step) and `flops_per_step`. Falls back to
    `plan/tracing/fallback.py` when fake tensors cannot run the step; `method` says which way was used.
    `warmup="step"` runs a whole first step, as a training process does (the caching-allocator model
    must see the same history); `"copy"` gives the same events with the first step's forward and
    backward copied from the steady step's instead of traced (plan/memory/warmup.py; the default for "cuda",
    traced as "step" where a copy would differ); `"optimizer"` only creates the optimizer state, without
    the first forward/backward (the default for "cpu", whose live-bytes peak does not depend on
    history). "copy" and "optimizer" trace one forward/backward instead of two. `layers` (with
    `fallback=False`): the model has that many repeated blocks; each event is tagged with its block's unit
    (`units`; plan/tracing/repeat.py's rebuild). `batch_size` comes validated from the public edge (the CLI's
    argument parser, plan/inputs.resolve_inputs); the workload's own `build_batch` guards it again.
    """
    check_target(target)
    workload = load_workload(workload)
    config = config or StepConfig()
    warm_optimizer(config.optimizer)  # a library's once-per-process tensors are not the step's
    if warmup is None:
        warmup = "copy" if target == "cuda" else "optimizer"
    if warmup not in WARMUPS:
        raise GpuwiseError(f"unknown warm-up {warmup!r}; choose from: {', '.join(WARMUPS)}")
    if not fallback:
        return _run(workload, batch_size, config, target, fake=True, warmup=warmup, layers=layers, units=units)
    if layers is not None:
        raise ValueError("layers= tags a fake trace's events: pass fallback=False")
    return trace_with_fallback(lambda b: run_fake(workload, b, config, target, warmup),
                               lambda b: run_real(workload, b, config, target, warmup), batch_size, workload)


# -- what a trace of another kind (plan/inference.py's generation) uses of the tracer besides its dispatch mode
# (plan/tracing/dispatch.py): the labelling of storages built outside it, and the settled events --
label = _label
settle = _settle
