"""Which module is running: the innermost one in forward, the one whose backward runs in backward.

torch.utils.module_tracker.ModuleTracker registers grad hooks per module call and keeps their
handles until it exits, which keeps autograd nodes, and with them recomputed activations of
checkpointed blocks, alive: a tracer must not change what it measures. This scope holds no tensor:
forward uses global module hooks and a stack of names; each module's output autograd node gets the
module's name in its `metadata`, and in backward the last such node the engine ran names the module.
"""

from __future__ import annotations

import contextlib
import weakref

KEY = "gpuwise_module"


class ModuleScope:
    def __init__(self) -> None:
        self.stack: list[str] = []
        self.names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._backward = ""
        self._handles: list = []

    def _name(self, module) -> str:
        name = self.names.get(module)
        if name is None:  # first time seen outside any known module: name its subtree from here
            for sub_name, sub in module.named_modules():
                self.names.setdefault(sub, sub_name)
            name = self.names.get(module, "")
        return name

    def name_from(self, model) -> None:
        """Name every module by its path in `model`, whichever of them a loss calls first (a loss that runs the
        model's body and head itself, plan/tracing/losses.py, names them as the model's own forward does)."""
        for name, sub in model.named_modules():
            self.names.setdefault(sub, name)

    def _pre(self, module, _inputs) -> None:
        self.stack.append(self._name(module))

    def _post(self, module, _inputs, output) -> None:
        import torch
        from torch.utils._pytree import tree_leaves

        name = self.stack.pop() if self.stack else self._name(module)
        for t in tree_leaves(output):
            if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                t.grad_fn.metadata.setdefault(KEY, name)

    @contextlib.contextmanager
    def outside(self):
        """Ops the training loop runs outside every module, in the backward too (an autograd final callback,
        plan/tracing/losses.py's training metrics): their events name no module."""
        self.stack.append("")
        try:
            yield
        finally:
            self.stack.pop()

    def backward_starts(self) -> None:
        self._backward = ""

    def current(self, remember: bool = True) -> str:
        """Dotted name of the running module ("" outside modules). In backward, a node without a module says the
        last one seen; `remember=False` asks without making this node's module the one seen (a look that must
        not change what the tracer's own later looks say)."""
        import torch

        if self.stack:
            return self.stack[-1]
        if torch._C._current_graph_task_id() != -1:
            node = torch._C._current_autograd_node()
            name = None if node is None else node.metadata.get(KEY)
            if name is None:
                return self._backward
            if remember:
                self._backward = name
            return name
        return ""

    def __enter__(self) -> ModuleScope:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        # always_call: a checkpointed block's recompute is stopped early by an exception
        # (torch.utils.checkpoint's _StopRecomputationError); its names must still leave the stack
        self._handles = [register_module_forward_pre_hook(self._pre),
                         register_module_forward_hook(self._post, always_call=True)]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
