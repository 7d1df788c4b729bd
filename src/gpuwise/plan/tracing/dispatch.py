"""The tracer's dispatch mode (`TraceMode`): every aten op of a traced step passes here once. It follows each
storage an op creates on the target device (views share it, it is counted once, and it is freed when its last
reference dies: a weakref on the fake tensor's untyped storage, as torch.distributed._tools.mem_tracker does),
adds the workspaces kernels take below the dispatcher (plan/tracing/kernels.py), and, in the steady step, counts
FLOPs with torch.utils.flop_counter's formulas and records what the speed model prices (plan/speed/ops.py),
the middle repeated block's ops apart where blocks are tagged (plan/tracing/repeat.py). plan/tracing/trace.py
runs the step under it.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from typing import Any

from ..speed.composite_ops import cudnn_rnn_flops, grouped_mm_flops
from ..speed.ops import CUDNN_RNN_OPS, GROUPED_MM_NAME, OpCosts
from . import grouped_mm
from .accumulation import InputBufferSums
from .kernels import FRESH_ZEROS_OPS, INPLACE_WITHOUT_MODE, output_bytes, promotion_copies_bytes, workspace
from .probe import probe, probed
from .repeat_tags import MIDDLE


@dataclass
class _Block:
    nbytes: int
    phase: str
    module: str
    op: str
    freed: bool = False
    category: str = ""


@dataclass
class _Recorder:
    """Raw events as they happen; categories are settled at the end, once grads and state are known."""

    # action, block, phase, module, op, layer (the repeated block running, when plan/tracing/repeat.py follows them)
    events: list[tuple[str, int, str, str, str, int | None]] = field(default_factory=list)
    blocks: list[_Block] = field(default_factory=list)


def _dispatch_mode_base():
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


def _prim_device():
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    return torch.ops.prim.device.default, FakeTensor


_PRIM_DEVICE, _FakeTensor = _prim_device()


class TraceMode(_dispatch_mode_base()):
    """A dispatch mode on top of FakeTensorMode: sees every aten op and the storages it creates."""

    def __init__(self, target: str, tracker, count_flops: bool = True):
        super().__init__()
        import torch.utils.flop_counter as fc

        self.device_type = "cpu"  # tensors live on the CPU (fake); `target` is the device they stand for
        self.target = target
        self.tracker = tracker
        self.rec = _Recorder()
        self.phase = "setup"
        self.live: dict[int, tuple[int, Any]] = {}  # id(storage) -> (block, weakref)
        self.flops = 0
        self.count_flops = False
        self.costs = OpCosts()  # the steady step's ops for the speed model (plan/speed/ops.py)
        self._flop_registry = fc.flop_registry if count_flops else {}
        self.item_default: Any = None  # value for .item() while a GradScaler asks whether grads are finite
        self.saved: set[int] = set()  # forward blocks still alive when backward starts: saved activations
        self.notes: list[str] = []
        self.sums = InputBufferSums()  # the engine's in-place gradient sums (plan/tracing/accumulation.py)
        self._paused = False
        self.layers = None  # plan/tracing/repeat.py's LayerTags: which repeated block each event belongs to
        # with `layers`: the steady step's ops of block 1 alone (its costs and FLOPs), for a rebuild that reuses
        # another micro-batch's 4-block check (plan/tracing/repeat.py BlockResidual)
        self.middle: OpCosts | None = None
        self.middle_flops = 0
        # while the model is built (`building`): for each storage made, the module its making was for, a weak
        # reference (an id could be a dead module's, reused) (plan/tracing/repeat_tags.py tag_construction)
        self.building = False
        self.built_in: dict[int, Any] = {}

    @contextlib.contextmanager
    def following_construction(self):
        """Inside (the model's construction and weight initialisation, which run in no module's forward), each
        storage made is noted with the module it was made for (`built_in`, `_module_being_built`)."""
        self.building = True
        try:
            yield
        finally:
            self.building = False

    @contextlib.contextmanager
    def paused(self):
        """Ops run inside are not recorded (e.g. building a real model that is then copied to fake)."""
        self._paused = True
        try:
            yield
        finally:
            self._paused = False

    def forget_since(self, events: int, blocks: int) -> None:
        """Drop what was recorded after `events` events and `blocks` storages (an attempt that failed and is run
        another way: its storages never existed in the run; their later frees are not recorded either)."""
        del self.rec.events[events:]
        for key in [k for k, (b, _) in self.live.items() if b >= blocks]:
            del self.live[key]
        for b in [b for b in self.built_in if b >= blocks]:
            del self.built_in[b]
        for block in self.rec.blocks[blocks:]:
            block.freed = True

    # --- storages -------------------------------------------------------------------------------
    def module(self, remember: bool = True) -> str:
        """The module running now; outside every module while autograd accumulates a gradient into a leaf
        (AccumulateGrad runs after the module's backward, whose scope would otherwise linger). `remember=False`:
        a look that leaves no trace on later looks (the op costs' tags; the events' modules stay as they were)."""
        if self.phase == "backward" and _accumulating_grad(remember):
            return ""
        return self.tracker.current(remember)

    def alloc(self, nbytes: int, op: str, storage=None) -> int:
        block = len(self.rec.blocks)
        module = self.module()
        self.rec.blocks.append(_Block(nbytes, self.phase, module, op))
        layer = None if self.layers is None else self.layers.on_alloc(block, module)
        self.rec.events.append(("alloc", block, self.phase, module, op, layer))
        if self.building:
            made_for = _module_being_built()
            if made_for is not None:
                self.built_in[block] = weakref.ref(made_for)
        if storage is not None:
            key = id(storage)
            self.live[key] = (block, weakref.ref(storage, lambda _r, k=key: self.free_key(k)))
        return block

    def free_block(self, block: int, op: str = "") -> None:
        b = self.rec.blocks[block]
        if not b.freed:
            b.freed = True
            now = self.module() if op or self.layers is not None else ""
            layer = None if self.layers is None else self.layers.layer_of(now)
            self.rec.events.append(("free", block, self.phase, now if op else b.module, op, layer))
            self.sums.freed(block, self.rec.events)

    def free_key(self, key: int) -> None:
        entry = self.live.pop(key, None)
        if entry is not None:
            self.free_block(entry[0])

    def see(self, t, op: str, nbytes: int | None = None) -> None:
        if t.device.type != self.device_type:
            return
        st = t.untyped_storage()
        if id(st) in self.live:
            return
        nbytes = st.nbytes() if nbytes is None else nbytes
        if nbytes:
            self.alloc(nbytes, op, st)

    def _as_in_place(self, zeros, out, op: str) -> None:
        """`out` replaces the fresh zeros tensor it was computed from (in place in a plain process):
        the zeros' block ends here and `out` is counted from now."""
        block = self.block_of(zeros)
        if block is not None and self.rec.blocks[block].op in FRESH_ZEROS_OPS:
            self.free_block(block, op)

    def block_of(self, t) -> int | None:
        entry = self.live.get(id(t.untyped_storage()))
        return None if entry is None else entry[0]

    # --- dispatch -------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        import torch

        kwargs = kwargs or {}
        if self._paused:
            return func(*args, **kwargs)
        if self.phase in ("forward", "backward") and torch._C._current_graph_task_id() != -1:
            if self.phase == "forward":
                self.tracker.backward_starts()
                self.saved |= {i for i, b in enumerate(self.rec.blocks) if b.phase == "forward" and not b.freed}
            self.phase = "backward"
        elif self.phase == "backward":
            self.phase = "optimizer"
        if func is _PRIM_DEVICE:  # `.device` of a fake tensor (most ops of a trace): no kernel, no storage
            # FakeTensor's own `device` property answers as FakeTensorMode's prim.device handler does
            # (the fake device; meta inside a kernel), without the dispatch down to FakeTensorMode
            out = args[0].device if type(args[0]) is _FakeTensor else func(*args, **kwargs)
            if self.phase == "backward":
                self.sums.pending = None  # as `sums.candidate` does for every op
            if self.count_flops:
                self.costs.record("prim.device", self.phase, args, kwargs, out, 0, func)
                if self.middle is not None and self.layers.layer_of(self.module(remember=False)) == MIDDLE:
                    self.middle.record("prim.device", self.phase, args, kwargs, out, 0, func)
                elif self.middle is not None:
                    self.middle.elsewhere("prim.device", self.phase, args, out)
            return out
        if func is torch.ops.aten._local_scalar_dense.default and self.item_default is not None:
            try:  # constants (e.g. an optimizer's step count) still have values under fake tensors
                return func(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001
                if type(exc).__name__ != "DataDependentOutputException":
                    raise
                return self.item_default
        name = str(func.overloadpacket) if hasattr(func, "overloadpacket") else str(func)
        summed = (self.sums.candidate(name, args, kwargs, self.block_of, self.rec.blocks)
                  if self.phase == "backward" else None)
        measured = probe(func, name, args, kwargs) if self.target == "cpu" and probed(name, args) else None
        scratch = measured.workspace if measured is not None else workspace(name, self.target, args, kwargs)
        if self.layers is not None:
            self.layers.set_inputs(self, args, kwargs)
        if scratch.before_bytes:
            self.free_block(self.alloc(scratch.before_bytes, f"kernel workspace: {name}"), name)
        during_bytes = scratch.during_bytes
        if measured is None:
            during_bytes += promotion_copies_bytes(func, name, self.target, args)
        during = self.alloc(during_bytes, f"kernel workspace: {name}") if during_bytes else None
        out = (grouped_mm.output(args, kwargs, self.target) if grouped_mm.needs_output(func, args)
               else func(*args, **kwargs))
        if self.count_flops:
            formula = self._flop_registry.get(func.overloadpacket)
            op_flops = int(formula(*_operands(func, args), **kwargs, out_val=out)) if formula is not None else 0
            if formula is None and name in CUDNN_RNN_OPS:  # no torch formula: the GEMMs cuDNN runs
                op_flops = cudnn_rnn_flops(name, args)
            elif formula is None and name == GROUPED_MM_NAME:
                op_flops = grouped_mm_flops(args, kwargs)
            self.flops += op_flops
            module = self.module(remember=False)
            self.costs.record(name, self.phase, args, kwargs, out, op_flops, func, module)
            if self.middle is not None and self.layers.op_layer(module) == MIDDLE:
                self.middle_flops += op_flops
                self.middle.record(name, self.phase, args, kwargs, out, op_flops, func, module)
            elif self.middle is not None:
                self.middle.elsewhere(name, self.phase, args, out)
        if isinstance(out, torch.Tensor):
            if self.phase == "backward" and name in INPLACE_WITHOUT_MODE:
                self._as_in_place(args[INPLACE_WITHOUT_MODE[name]], out, name)
            self.see(out, name, measured.output_bytes.get(0) if measured is not None else None)
            if summed is not None and self.block_of(out) == len(self.rec.blocks) - 1:
                self.sums.watch(summed, len(self.rec.events) - 1)
        elif isinstance(out, (tuple, list)):
            sizes = measured.output_bytes if measured is not None else output_bytes(name, self.target, args, kwargs)
            for i, t in enumerate(out):
                if self.layers is not None:
                    self.layers.output_index = i
                if isinstance(t, torch.Tensor):
                    self.see(t, name, sizes.get(i))
                elif isinstance(t, (tuple, list)):
                    for u in t:
                        if isinstance(u, torch.Tensor):
                            self.see(u, name)
        if during is not None:
            self.free_block(during, name)
        if self.layers is not None:
            self.layers.op_done()
        return out


def _module_being_built():
    """The module the innermost caller with one is building or initialising: its `module` argument
    (transformers' `_init_weights(self, module)`, `Module.apply`'s functions), else its `self` (an `__init__`)."""
    import sys

    import torch

    frame = sys._getframe(2)
    for _ in range(40):
        if frame is None:
            return None
        local = frame.f_locals
        for name in ("module", "self"):
            if isinstance(local.get(name), torch.nn.Module):
                return local[name]
        frame = frame.f_back
    return None


_RAN = "gpuwise_ran_in"  # a leaf cast node's metadata: the backward runs (graph tasks) it ran in


def _accumulating_grad(remember: bool = True) -> bool:
    """AccumulateGrad runs, or again the cast of a leaf's gradient that feeds it (ToCopyBackward0 ->
    AccumulateGrad, run in an earlier backward already): autocast keeps one cast per weight for its whole
    region, so with gradient accumulation a later micro-step reuses the node an earlier forward made, and
    the engine runs it after that micro-step's whole backward, where the first block's scope lingers."""
    import torch

    node = torch._C._current_autograd_node()
    if node is None:
        return False
    kind = type(node).__name__
    if kind == "AccumulateGrad":
        return True
    if kind != "ToCopyBackward0" or not node.next_functions or not all(
            fn is None or type(fn).__name__ == "AccumulateGrad" for fn, _ in node.next_functions):
        return False
    task, ran_in = torch._C._current_graph_task_id(), node.metadata.get(_RAN)
    if not ran_in:
        if remember:
            node.metadata[_RAN] = {task}  # its first backward: in the scope of the module that made it
        return False
    return task not in ran_in


# mm / bmm / addmm / baddbmm's `.dtype` and `.dtype_out` overloads (torch >= 2.8: a 16-bit product accumulated
# into float32, `addmm(..., out_dtype=torch.float32, out=)`) take the output dtype after their operands, where
# torch's flop formulas take `out_shape`
_OPERANDS = {"mm": 2, "bmm": 2, "addmm": 3, "baddbmm": 3}


def _operands(func, args: tuple) -> tuple:
    if func._overloadname in ("dtype", "dtype_out") and func.overloadpacket.__name__ in _OPERANDS:
        return args[:_OPERANDS[func.overloadpacket.__name__]]
    return args


def active_trace_mode() -> TraceMode | None:
    """gpuwise's tracing dispatch mode when one is active, else None (a real run)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return next((m for m in _get_current_dispatch_mode_stack() if isinstance(m, TraceMode)), None)
