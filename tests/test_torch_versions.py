"""torch <= 1.10's softmax / log_softmax autograd kept the input for backward (plan/tracing/torch_versions.py)."""

from __future__ import annotations

import gc
import weakref

import torch

from gpuwise.plan.tracing.torch_versions import softmax_saves_input


def _scores_alive_after_forward(fn, enabled: bool, checkpoint: bool = False):
    """(alive after the forward, alive after backward): the softmax input made inside `fn`."""
    x = torch.randn(2, 4, 8, requires_grad=True)
    seen = {}

    def body(x):
        scores = x * 2.0
        seen["ref"] = weakref.ref(scores)
        return fn(scores)

    with softmax_saves_input(enabled):
        if checkpoint:
            out = torch.utils.checkpoint.checkpoint(body, x, use_reentrant=False)
        else:
            out = body(x)
        loss = (out * 3.0).sum()
    gc.collect()
    alive_forward = seen["ref"]() is not None
    loss.backward()
    gc.collect()
    return alive_forward, seen["ref"]() is not None


def test_softmax_keeps_its_input_until_its_backward_as_torch_1_10():
    softmax = lambda s: torch.softmax(s, -1)  # noqa: E731
    assert _scores_alive_after_forward(softmax, enabled=False) == (False, False)  # today's torch: result only
    assert _scores_alive_after_forward(softmax, enabled=True) == (True, False)  # kept, then released


def test_log_softmax_inside_cross_entropy_keeps_the_logits():
    ce = lambda s: torch.nn.functional.cross_entropy(s.reshape(-1, 8), torch.zeros(8, dtype=torch.long))  # noqa: E731
    assert _scores_alive_after_forward(ce, enabled=False) == (False, False)
    assert _scores_alive_after_forward(ce, enabled=True) == (True, False)


def test_checkpointed_blocks_keep_nothing_more_in_forward():
    # torch 1.10's (reentrant) checkpoint ran the forward without grad: nothing saved, the input neither
    softmax = lambda s: torch.softmax(s, -1)  # noqa: E731
    assert _scores_alive_after_forward(softmax, enabled=True, checkpoint=True) == (False, False)


def test_the_gradient_is_unchanged():
    x = torch.randn(3, 5, requires_grad=True)
    (torch.softmax(x, -1) ** 2).sum().backward()
    want = x.grad.clone()
    x.grad = None
    with softmax_saves_input():
        (torch.softmax(x, -1) ** 2).sum().backward()
    assert torch.allclose(x.grad, want)
