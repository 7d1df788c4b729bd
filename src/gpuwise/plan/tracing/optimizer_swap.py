"""Another optimizer in a traced step without tracing the step again: `fit` weighs the same step under AdamW,
8-bit AdamW and Adafactor, which differ only from the optimizer's step on.

A step's events are its forward and backward (the same whatever the optimizer: autograd leaves the same
gradients) and what the optimizer allocates and frees: when it is made (8-bit AdamW's quantization tables,
Adagrad's state; the trace marks where: `optimizer_made_at`), and in the warm-up and the steady step's
`optimizer.step()` (the state it creates on its first step, the temporaries of every step). `optimizer_steps`
traces only those: the optimizer made and stepping twice on the whole model (its parameters, a gradient each, as
backward leaves them), with the trace's own dispatch mode, CUDA's foreach default and category labels; `swapped`
finds one optimizer's events in a step traced with it, event for event, and puts another's in their place.

The swap checks itself, as the rebuild of repeated blocks does: the traced step's own optimizer, traced alone,
must be found in it event for event (sizes, categories, order): where it was made, once in the warm-up and once
in the steady step, with no event outside those runs touching their storages. Where it is not (a parameter without a gradient, an
optimizer that allocates nothing in a step, a workload whose step does more around `optimizer.step()`),
`swapped` returns None and the caller traces the step with the other optimizer. The speed model's op costs and
FLOPs move the same way: the step's, less its optimizer's steady step traced alone, plus the other's.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, replace

from ...step import StepConfig, make_optimizer, warm_optimizer
from ..memory.events import MemEvent, MemoryTrace
from ..speed.ops import OpCosts
from .scope import ModuleScope
from .setup import build_model_for_trace, fake_train_step, foreach_by_default


@dataclass
class OptimizerSteps:
    """One optimizer's two steps on a model, traced alone: the events of the first (creating the state) and of a
    steady one, the steady one's op costs and FLOPs."""

    made: list[MemEvent]   # its construction (a few optimizers make state or tables there)
    warm: list[MemEvent]
    steady: list[MemEvent]
    costs: OpCosts
    flops: int


def optimizer_steps(workload, config: StepConfig, target: str) -> OptimizerSteps:
    """`config`'s optimizer made, then stepping twice on `workload`'s model (its modes already applied), every trainable
    parameter with a gradient of its own shape and dtype, made outside the trace as backward makes them."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .dispatch import TraceMode  # deferred: imports torch
    from .trace import label, settle

    warm_optimizer(config.optimizer)  # a library's once-per-process tensors are not the step's (as trace_step)

    tracker = ModuleScope()
    mode = TraceMode(target, tracker)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    with fake_mode, tracker, mode, contextlib.ExitStack() as stack:
        if target == "cuda":
            stack.enter_context(foreach_by_default())
        with mode.paused():
            model = build_model_for_trace(workload, fake_mode, mode)
            step = fake_train_step(workload, config, model)
        params = [p for p in step.model.parameters() if p.requires_grad]  # TrainStep's
        label(mode, list(step.model.parameters()), "parameters", create=True)
        label(mode, list(step.model.buffers()), "buffers", create=True)
        made = len(mode.rec.events)
        if config.optimizer is None and workload.optimizer_fn is not None:  # as TrainStep makes it, recorded
            opt = workload.optimizer_fn(params)
        else:
            opt = make_optimizer(config.optimizer or "adamw", params, config.optimizer_impl)
        mode.phase = "backward"
        built = len(mode.rec.events)
        for p in params:  # recorded, as backward makes them, but not one of the runs
            p.grad = torch.zeros_like(p)
        mode.phase = "optimizer"
        first = len(mode.rec.events)
        opt.step()
        label(mode, [list(s.values()) for s in opt.state.values()], "optimizer_state")  # as the trace's post-hook
        second = len(mode.rec.events)
        mode.count_flops = True
        opt.step()
        mode.count_flops = False
        label(mode, [list(s.values()) for s in opt.state.values()], "optimizer_state")
        events = settle(mode)
        flops, costs = mode.flops, mode.costs
        del step, opt, model
    return OptimizerSteps(events[made:built], events[first:second], events[second:], costs, flops)


def _shape(events: list[MemEvent]) -> list[tuple]:
    """The events with their blocks numbered by first appearance: what two traces of the same ops share."""
    local: dict[int, int] = {}
    return [(e.action, local.setdefault(e.block, len(local)), e.nbytes, e.category, e.op) for e in events]


def _find(events: list[MemEvent], run: list[MemEvent], lo: int, hi: int) -> int | None:
    """Where `run` occurs in `events[lo:hi]` (its blocks numbered alike); None where it does not, or twice."""
    want = _shape(run)
    first = want[0]
    found = [i for i in range(lo, hi - len(run) + 1)
             if events[i].action == first[0] and events[i].nbytes == first[2] and events[i].op == first[4]
             and _shape(events[i:i + len(run)]) == want]
    return found[0] if len(found) == 1 else None


def swapped(trace: MemoryTrace, own: OptimizerSteps, other: OptimizerSteps, note: str) -> MemoryTrace | None:
    """`trace` with `own`'s two optimizer steps (its optimizer's, traced alone) replaced by `other`'s; None where
    `own`'s are not found in it exactly once each (module docstring)."""
    if not own.warm or not own.steady or trace.op_costs is None:
        return None
    events = trace.events
    start = trace.steady_start
    made = getattr(trace, "optimizer_made_at", None)
    if own.made or other.made:  # construction events: right before where the trace says the optimizer was made
        if made is None or made < len(own.made) or \
                _shape(events[made - len(own.made):made]) != _shape(own.made):
            return None
    m = made - len(own.made) if made is not None else 0
    w = _find(events, own.warm, 0, start)
    s = _find(events, own.steady, start, len(events))
    if w is None or s is None or not m <= w:
        return None
    runs = set(range(m, m + len(own.made))) | set(range(w, w + len(own.warm))) | set(range(s, s + len(own.steady)))
    blocks = {events[i].block for i in runs}
    if any(e.block in blocks for i, e in enumerate(events) if i not in runs):
        return None  # a storage of the optimizer's steps touched outside them
    fresh = max((e.block for e in events), default=-1) + 1
    ids: dict[int, int] = {}  # the other's blocks, new numbers (shared by its two steps: its state)

    def renumbered(run: list[MemEvent]) -> list[MemEvent]:
        nonlocal fresh
        out = []
        for e in run:
            if e.block not in ids:
                ids[e.block], fresh = fresh, fresh + 1
            out.append(replace(e, block=ids[e.block]))
        return out

    made_, warm, steady = renumbered(other.made), renumbered(other.warm), renumbered(other.steady)
    new = (events[:m] + made_ + events[m + len(own.made):w] + warm + events[w + len(own.warm):s] + steady
           + events[s + len(own.steady):])
    out = copy.copy(trace)
    out.events = new
    out.steady_start = start + len(made_) - len(own.made) + len(warm) - len(own.warm)
    if made is not None:
        out.optimizer_made_at = made + len(made_) - len(own.made)
    out.notes = list(trace.notes) + [note]
    out.op_costs = trace.op_costs.added(own.costs, -1).added(other.costs)
    out.flops_per_step = trace.flops_per_step - own.flops + other.flops
    for attr in ("block_residual", "middle_costs", "middle_flops"):  # the traced step's rebuild, not this one's
        if hasattr(out, attr):
            setattr(out, attr, None)
    return out
