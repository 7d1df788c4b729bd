"""keep_last_loss (`--loop-keeps-loss`): a loop that keeps its last loss until the next one replaces it
(litgpt's finetune loops) keeps that loss's autograd graph. Autograd frees what ops saved for backward as
backward runs, so for plain ops the graph holds nothing after it; what a custom Function keeps as a ctx
attribute (bitsandbytes <= 0.43.1 MatMul4Bit: `ctx.tensors = (A, B)`) lives with the graph, into the next
step's forward."""

from __future__ import annotations

import torch
from torch import nn

from gpuwise.plan.inputs import resolve_inputs
from gpuwise.plan.tracing.modes import apply_modes, make_modes
from gpuwise.plan.tracing.trace import trace_step
from gpuwise.step import StepConfig
from gpuwise.workload import load_workload

WIDTH, BATCH = 64, 32


class _KeepsInputInCtx(torch.autograd.Function):
    """A frozen matmul as bitsandbytes <= 0.43.1 wrote it: its input kept as a ctx attribute."""

    @staticmethod
    def forward(ctx, a, w):
        ctx.tensors = (a, w)
        return a @ w.t()

    @staticmethod
    def backward(ctx, grad):
        _, w = ctx.tensors
        return grad @ w, None


class _Model(nn.Module):
    def __init__(self, keeps: bool):
        super().__init__()
        self.keeps = keeps
        self.first = nn.Linear(WIDTH, WIDTH)  # trainable: the frozen matmul's input needs grad
        self.frozen = nn.Parameter(torch.randn(WIDTH, WIDTH), requires_grad=False)
        self.last = nn.Linear(WIDTH, 1)

    def forward(self, x):
        h = self.first(x)
        h = _KeepsInputInCtx.apply(h, self.frozen) if self.keeps else h @ self.frozen.t()
        return self.last(torch.relu(h)).sum()


def _trace(keeps: bool, keep_last_loss: bool, grad_accum: int = 1):
    wl, batch_size = resolve_inputs(None, BATCH, _Model(keeps), lambda b: torch.randn(b, WIDTH), lambda m, x: m(x))
    wl = apply_modes(load_workload(wl), make_modes(grad_accum))
    return trace_step(wl, batch_size, StepConfig(keep_last_loss=keep_last_loss), "cpu", warmup="step")


def _carried_into_forward(trace) -> int:
    """Bytes allocated before the steady step and freed in its forward: what the last step left alive."""
    before = {e.block for e in trace.events[:trace.steady_start] if e.action == "alloc"}
    return sum(e.nbytes for e in trace.events[trace.steady_start:]
               if e.action == "free" and e.phase == "forward" and e.block in before)


def test_a_kept_loss_keeps_what_a_function_holds_in_ctx_into_the_next_forward():
    # the last step's input of the frozen matmul (BATCH x WIDTH fp32) and the loss (a 0-d fp32) are freed
    # only in the next forward
    assert _carried_into_forward(_trace(True, True)) == BATCH * WIDTH * 4 + 4
    assert _carried_into_forward(_trace(True, False)) == 0


def test_a_kept_loss_holds_nothing_more_for_plain_ops():
    assert _carried_into_forward(_trace(False, True)) == 4  # the loss alone


def test_gradient_accumulation_releases_the_kept_loss_per_micro_batch():
    # each micro-batch's loss replaces the kept one: one micro-batch's ctx input carried, not one per micro-batch
    def carried_between_micro_batches(trace) -> int:
        steady = trace.events[trace.steady_start:]
        last = max(i for i in range(1, len(steady))  # where the last micro-batch's forward starts
                   if steady[i].phase == "forward" and steady[i - 1].phase == "backward")
        earlier = {e.block for e in steady[:last] if e.action == "alloc"}
        return sum(e.nbytes for e in steady[last:] if e.action == "free" and e.phase == "forward" and e.block in earlier)

    kept, freed = _trace(True, True, grad_accum=4), _trace(True, False, grad_accum=4)
    assert _carried_into_forward(kept) == BATCH * WIDTH * 4 + 4
    assert carried_between_micro_batches(kept) == BATCH * WIDTH * 4 + 4
    assert carried_between_micro_batches(freed) == 0
