"""What older torch releases saved for backward that the installed one does not.

gpuwise traces the installed torch. A published measurement ran the torch of its time; where the autograd
formulas of that release kept more alive, the trace puts it back:

- up to torch 1.10, `_softmax` and `_log_softmax` saved their input `self` next to their `result`: the
  backward kernels `_softmax_backward_data(grad, result, dim, self)` took `self` only for its dtype
  (pytorch/pytorch issue 64000, "Softmax/logsoftmax use more memory for backward than needed"). PR 65242,
  relanded as PR 66018 on 2021-10-01 after the 1.10 release branch was cut, saves `self.scalar_type()`
  instead; torch 1.11 (March 2022) is the first release without the saved input (transformers'
  pytorch_utils.softmax_backward_data calls the old signature when `is_torch_less_than_1_11`). So a run
  on torch <= 1.10 keeps every softmax input (eager attention's fp32 (L, L) scores; the logits
  cross_entropy's log_softmax reads) until that softmax's backward runs.
  `softmax_saves_input()` attaches the input to the op's autograd node and releases it when the node's
  backward has run, as the engine releases a node's saved variables. Where saved-tensor hooks are in force
  (gpuwise's activation checkpointing, non-reentrant) nothing is attached: torch 1.10 had only the reentrant
  checkpoint (`use_reentrant=False` came in 1.11), whose forward runs without grad and saves nothing; the
  one block its recompute holds at a time is the part left out.
"""

from __future__ import annotations

import contextlib

_KEY = "gpuwise: saved self (torch <= 1.10)"
_NODES = ("SoftmaxBackward0", "LogSoftmaxBackward0")
SOFTMAX_NOTE = ("torch <= 1.10: softmax and log_softmax keep their input for backward next to the output "
                "(dropped in torch 1.11, PyTorch PR 65242)")


def _dispatch_mode_base():
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


class _SoftmaxKeepsInput(_dispatch_mode_base()):
    """Sees `_softmax` / `_log_softmax` below autograd; autograd sets the output's grad_fn only after the
    kernel returns (and after the `prim.device` / `detach` calls it makes itself while saving the result),
    so the input is attached to that node when the next other op is dispatched (or on exit)."""

    def __init__(self):
        super().__init__()
        self.pending: list[tuple] = []

    def attach_pending(self) -> None:
        pending, self.pending = self.pending, []
        for out, inp in pending:
            node = out.grad_fn
            if node is None or type(node).__name__ not in _NODES or _KEY in node.metadata:
                continue
            md = node.metadata
            md[_KEY] = inp
            node.register_hook(_releaser(md))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        import torch

        kwargs = kwargs or {}
        if self.pending and func not in (torch.ops.prim.device.default, torch.ops.aten.detach.default):
            self.attach_pending()
        out = func(*args, **kwargs)
        if (func in (torch.ops.aten._softmax.default, torch.ops.aten._log_softmax.default)
                and isinstance(out, torch.Tensor) and torch.is_grad_enabled()):
            if torch._C._autograd._top_saved_tensors_default_hooks(False) is None:
                self.pending.append((out, args[0]))
        return out


def _releaser(md: dict):
    """A post hook dropping the kept input once the node's backward has run (holds the dict, not the node)."""
    def release(_grad_inputs, _grad_outputs):
        md.pop(_KEY, None)

    return release


@contextlib.contextmanager
def softmax_saves_input(enabled: bool = True):
    """torch <= 1.10's softmax / log_softmax autograd: the input kept for backward next to the result."""
    if not enabled:
        yield
        return
    mode = _SoftmaxKeepsInput()
    with mode:
        try:
            yield
        finally:
            mode.attach_pending()
