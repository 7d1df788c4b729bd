"""Gradients that meet in autograd's input buffer: summed in place in a real step, out of place in a trace.

When a tensor feeds two ops, its two gradients arrive separately and the engine sums them in the next
node's input buffer (torch/csrc/autograd/input_buffer.cpp `accumulate`). In a plain process the sum is
`old_var.add_(var)` when grad mode is off and the buffer holds the last reference to a dense `old_var`
(`can_accumulate_inplace`): no new memory. That test also requires `!isTensorSubclassLike(old_var)`,
which is true whenever a Python dispatch mode is on (`c10::impl::dispatch_mode_enabled()`), so under the
tracer every such sum is `old_var + var`: a new tensor the size of the gradient next to both operands.
The trace then over-counts one gradient at every branch point (a slice read twice: +19 % on a small MLP;
PEGASUS-X's block-local attention: +5.7 %).

`InputBufferSums` finds these sums and records them as the real step does them. An `aten.add.Tensor`
in the backward is the engine's sum when its first operand (`old_var`) is a gradient an earlier node
produced that is not an input of the node now running (so it sits in another node's input buffer: a
backward formula adding its own incoming gradient does not qualify), its second was produced by the
node now running, both have the same shape and dtype, `old_var` is dense and not a view (a view holds
its base, so its storage's use count is 2: a tied Linear weight's `.t()` gradient is summed out of
place in a real step too), grad mode is off, and
`old_var`'s storage dies as soon as the sum is stored (the buffer held its last reference). Its free is
then moved before the sum's allocation: the sum takes `old_var`'s place, as `add_` would.
Node boundaries come from a pre-hook on every node of the graph being run (`node_prehooks`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable


def _dense(t) -> bool:
    """`is_non_overlapping_and_dense`: the strides are a permutation of a contiguous layout's."""
    dims = sorted((s, n) for s, n in zip(t.stride(), t.shape, strict=True) if n != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


class InputBufferSums:
    """Bookkeeping for the tracer (plan/tracing/dispatch.py `TraceMode`): node boundaries, and the one sum whose
    operand may be freed next."""

    def __init__(self):
        self.node_first_block = 0          # blocks from this index on were made by the running node
        self.node_inputs: set[int] = set()  # ids of the running node's input-gradient storages
        self.pending: tuple[int, int] | None = None  # (old_var's block, event index of the sum's alloc)

    def node_begins(self, grad_outputs, blocks_so_far: int) -> None:
        import torch

        self.node_first_block = blocks_so_far
        self.node_inputs = {id(g.untyped_storage()) for g in grad_outputs if isinstance(g, torch.Tensor)}

    def candidate(self, name: str, args, kwargs, block_of: Callable, blocks) -> int | None:
        """old_var's block when this op looks like the engine's sum, else None."""
        import torch

        self.pending = None
        if name != "aten.add" or kwargs.get("alpha", 1) != 1 or len(args) != 2 or torch.is_grad_enabled():
            return None
        old, new = args
        if not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)):
            return None
        if old.shape != new.shape or old.dtype != new.dtype or old.is_sparse or not _dense(old):
            return None
        if old._is_view():  # a view keeps its base: the storage's use count is 2 (e.g. a Linear's `.t()` grad)
            return None
        if id(old.untyped_storage()) in self.node_inputs:
            return None
        old_block, new_block = block_of(old), block_of(new)
        if old_block is None or new_block is None:
            return None
        if old_block >= self.node_first_block or new_block < self.node_first_block:
            return None
        return old_block if blocks[old_block].phase == "backward" else None

    def watch(self, old_block: int, sum_event: int) -> None:
        self.pending = (old_block, sum_event)

    def freed(self, block: int, events: list) -> None:
        """`block` was just freed (its event is the last one): if it is the watched old_var, move its
        free before the sum's allocation."""
        if self.pending is None or self.pending[0] != block:
            return
        at = self.pending[1]
        self.pending = None
        events.insert(at, events.pop())


@contextlib.contextmanager
def node_prehooks(sums: InputBufferSums, blocks_so_far: Callable[[], int]):
    """While active, every backward run registers a pre-hook on each node of its graph that tells
    `sums` a node begins (torch.autograd.graph's `_register_logging_hooks_on_whole_graph` walks the
    graph the same way). Pre-hooks keep no reference to the gradients (a post-hook would)."""
    import torch.autograd as ag
    from torch.autograd.graph import _get_grad_fn_or_grad_acc

    original = ag._engine_run_backward

    def prehook(grad_outputs):
        sums.node_begins(grad_outputs, blocks_so_far())

    def run_backward(t_outputs, *args, **kwargs):
        roots = [_get_grad_fn_or_grad_acc(t) for t in t_outputs]
        seen, stack, handles = set(), [r for r in roots if r is not None], []
        seen.update(stack)
        while stack:
            node = stack.pop()
            handles.append(node.register_prehook(prehook))
            for fn, _ in node.next_functions:
                if fn is not None and fn not in seen:
                    seen.add(fn)
                    stack.append(fn)
        try:
            return original(t_outputs, *args, **kwargs)
        finally:
            for h in handles:
                h.remove()

    ag._engine_run_backward = run_backward
    try:
        yield
    finally:
        ag._engine_run_backward = original
