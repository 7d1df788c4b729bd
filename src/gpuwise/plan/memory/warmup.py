"""A whole warm-up step's events without tracing its forward and backward twice.

The CUDA target replays the trace through the caching-allocator model, which must see the history a
process has: a first step (forward, backward, the optimizer creating its state, zero_grad), then the
steady one. The first step's forward and backward run the same ops as the steady step's, so instead of
tracing them twice (warm-up "step"), the steady step is traced once with the optimizer's first step
deferred into it (`DeferredWarmUp`) and the warm-up step is assembled: a copy of the
steady forward and backward (new storages, same sizes, categories, modules and ops), the deferred first
optimizer step (without the zero gradients it stepped on: the copy's gradients stand there), then
zero_grad freeing the copy's gradients and the loss as the steady step frees its own.

With a GradScaler the traced step is the scaler's first: its scale and growth tracker, made by the first
`scale`, stay in the warm-up step (`warm_up_step_from_steady`). Where that would not be the same step,
`NotCopyable` says why and the caller traces the warm-up step: a forward or backward that frees what an earlier step
made, storages the optimizer frees mid-step or nobody frees. plan/tracing/repeat.py uses it only where a
4-block trace is checked against a rebuild from a 3-block trace with a traced warm-up step, so a
copy that differed would be caught there (tests/test_plan_repeat.py also compares it with the traced
warm-up step directly).
"""

from __future__ import annotations

import dataclasses


class DeferredWarmUp:
    """The warm-up's optimizer state, created for exactly the parameters a real step gives a gradient.

    A real first step creates optimizer state only for parameters that got a gradient (torch.optim's
    `_init_group` skips `p.grad is None`): a head the loss never uses, a frozen branch, a parameter
    behind a data-dependent path get none. So the state is created when the steady step reaches its
    optimizer (the gradients are known then) by a warm-up `optimizer.step()` on zero gradients of
    those parameters; its events are then moved to where the warm-up belongs, before the steady
    step (`splice`). This costs no extra forward/backward, unlike a whole warm-up step."""

    def __init__(self, mode, step, at: int):
        self.mode, self.step, self.at = mode, step, at
        self.segment: tuple[int, int] | None = None
        self.steady_end: int | None = None  # where the steady step's optimizer step returned
        self._handles = []

    def __enter__(self):
        self._handles = [self.step.optimizer.register_step_pre_hook(self._warm_up),
                         self.step.optimizer.register_step_post_hook(self._stepped)]
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()

    def _stepped(self, *_a, **_k) -> None:
        if self.segment is not None and self.segment[1] >= 0 and self.steady_end is None:
            self.steady_end = len(self.mode.rec.events)

    def _warm_up(self, opt, *_a, **_k) -> None:
        import torch

        if self.segment is not None:
            return
        self.segment = (len(self.mode.rec.events), -1)
        phase, flops = self.mode.phase, self.mode.count_flops
        self.mode.phase, self.mode.count_flops = "optimizer", False
        stash = {}
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    stash[p] = p.grad
                    p.grad = torch.zeros_like(p)
        self.opt_start = len(self.mode.rec.events)  # before: the zero gradients
        try:
            opt.step()
        finally:
            for p, g in stash.items():
                p.grad = g
            del stash
        self.mode.phase, self.mode.count_flops = phase, flops
        self.segment = (self.segment[0], len(self.mode.rec.events))

    def splice(self) -> int:
        """Move the warm-up's events to the warm-up's place; returns how many moved."""
        if self.segment is None:
            return 0
        events = self.mode.rec.events
        a, b = self.segment
        born = {e[1] for e in events[a:b] if e[0] == "alloc"}
        moved = [e for e in events[a:b] if e[1] in born]
        kept = [e for e in events[a:b] if e[1] not in born]
        events[self.at:b] = moved + events[self.at:a] + kept
        for e in moved:  # the warm-up's blocks belong to the setup, as a first step's would
            self.mode.rec.blocks[e[1]].phase = "setup"
        return len(moved)


class NotCopyable(Exception):
    """The warm-up step cannot be assembled from the steady one (the message says why)."""


def warm_up_step_from_steady(mode, deferred, scaler: list[int | None] | None = None) -> int:
    """Rewrite `mode.rec.events` to setup, warm-up step, steady step; returns where the steady step starts.

    `scaler`: the blocks of a GradScaler's scale and growth tracker. The traced step is then the scaler's
    first: its `scale` made them (torch/amp/grad_scaler.py `_lazy_init_scale_growth_tracker`), where a
    first step makes them, so their allocations stay in the warm-up and leave the steady step, which is
    otherwise the same (`unscale_`'s inverse scale and found_inf, the per-device found_inf that
    `update` frees after the optimizer step). Those frees after the optimizer step follow the copied
    optimizer step as they follow the steady one."""
    if deferred.segment is None:
        raise NotCopyable("the step has no optimizer step")
    events, blocks = mode.rec.events, mode.rec.blocks
    at, (a, b), zeros_end = deferred.at, deferred.segment, deferred.opt_start
    forward_backward = events[at:a]
    born = {e[1] for e in forward_backward if e[0] == "alloc"}
    freed = {e[1] for e in forward_backward if e[0] == "free"}
    if freed - born:
        raise NotCopyable("the forward or backward frees a storage an earlier step made")
    made = set(scaler or ())
    if scaler is not None and (None in made or made - born or made & freed or deferred.steady_end is None):
        raise NotCopyable("a GradScaler's scale and growth tracker are not made by the step's scale")
    zeros = {e[1] for e in events[a:zeros_end] if e[0] == "alloc"}
    segment = events[a:b]
    born_in_segment = {e[1] for e in segment if e[0] == "alloc"}
    if any(e[1] not in born_in_segment for e in segment):
        raise NotCopyable("the first optimizer step frees a storage of the step")
    optimizer = [e for e in segment if e[1] not in zeros]
    alive = born - freed - made  # gradients, the loss (and found_inf): freed by zero_grad, the step's return
    later = [(i, e) for i, e in enumerate(events[b:], b) if e[0] == "free" and e[1] in alive]
    if scaler is None:
        ok = all(e[2] == "zero_grad" for _, e in later)
    else:  # after the optimizer step only these frees (update's, zero_grad's): none inside it
        ok = all(e[2] == "zero_grad" or i >= deferred.steady_end for i, e in later) and \
            len(events) - deferred.steady_end == sum(i >= deferred.steady_end for i, _ in later)
    if len(later) != len(alive) or not ok:
        raise NotCopyable("the step's optimizer frees a gradient, or a storage outlives the step")

    new: dict[int, int] = {}
    for e in forward_backward:
        if e[0] == "alloc" and e[1] not in made:
            orig = blocks[e[1]]
            new[e[1]] = len(blocks)
            blocks.append(dataclasses.replace(orig, freed=True))
            if e[1] in mode.saved:
                mode.saved.add(new[e[1]])
            if mode.layers is not None:
                mode.layers.block_layer[new[e[1]]] = mode.layers.block_layer.get(e[1])
    copy = [e if e[1] in made else (e[0], new[e[1]], *e[2:]) for e in forward_backward]
    zero_grad = [(e[0], new[e[1]], *e[2:]) for _, e in later]
    warm_up = copy + optimizer + zero_grad
    steady = [e for e in forward_backward if e[1] not in made]
    events[at:] = warm_up + steady + events[b:]
    return at + len(warm_up)
