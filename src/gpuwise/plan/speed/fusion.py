"""What a fusing compiler (torch.compile's Inductor) leaves of a step's memory-bound ops: `--compile`.

Eager PyTorch runs each pointwise op and reduction as its own kernel, which reads its operands from memory and
writes its result back: an RMSNorm is a square, a mean, an add, an rsqrt and two multiplies, six passes over the
activations. Inductor fuses the ops between two kernels it does not generate (GEMMs and SDPA's attention, which
it calls as library kernels; convolutions; the collectives) into few generated kernels that read what the group
takes from outside once and write only what outlives the group ("TorchInductor: a PyTorch native compiler",
PyTorch dev-discuss 2022: pointwise ops and reductions "fused into a single kernel"; Ansel et al., PyTorch 2,
ASPLOS '24: Inductor's speedups come from fusion "reducing memory traffic").

`Fusion` follows the trace's ops in order (plan/speed/ops.py `OpCosts.record` feeds it). A region is a run of
memory-bound ops of the forward or the backward inside one block (a numbered child of a module list, such as
`model.layers.3`: torchtitan and torchtune compile each transformer block on its own, and FSDP's units are the
blocks) between two kernels the compiler does not generate. Per phase it keeps:
    fused_bytes     bytes the fused kernels move: each storage a region reads that it did not make, once, and each
                    storage it makes that is still alive when the region ends (read later: by a GEMM, the next
                    region, the backward's saved activations, the optimizer), once; a storage made and dead within
                    the region stays in registers
    fused_kernels   one kernel per region (Inductor may split a region around a reduction; one is its floor)
    memory_kernels  the eager kernels of those memory-bound ops, the ones the fused kernels replace
Each region's bytes are its own (nothing is charged across regions), so a block's fused bytes are the same traced
among its neighbours or alone, as the rebuild of repeated blocks needs (plan/tracing/repeat.py). The optimizer's
steps and zero_grad are not compiled by compiling the model: their ops end regions and are priced eager.
Approximations: one kernel per region; every fused kernel at the bandwidth of a vectorised eager kernel
(plan/speed/memory_bound.py); a storage alive at the region's end is written even where nothing reads it later;
Inductor's recomputation in backward (the min-cut partitioner saves fewer activations) is not modelled, nor what
compiling does to memory: the memory estimate stays eager's.
"""

from __future__ import annotations

import weakref
from collections import Counter

FUSED_PHASES = ("forward", "backward")  # what compiling the model compiles


class Fusion:
    """The current region of one trace's memory-bound ops (see the module docstring); its counts go into the
    `OpCosts` that feeds it (`bytes_`, `kernels_`, `eager_kernels`)."""

    def __init__(self, bytes_: Counter, kernels_: Counter, eager_kernels: Counter):
        self.bytes, self.kernels, self.eager_kernels = bytes_, kernels_, eager_kernels
        self.where: tuple[str, str] | None = None  # (phase, block) of the current region
        self.launched = False                       # the current region has launched its kernel
        self.read: set[int] = set()                 # storages it has read from memory
        self.made: dict[int, tuple[int, weakref.ref]] = {}  # storages it made: identity -> (bytes, the storage)

    def close(self) -> None:
        """The region ends: what it made and is still alive is written."""
        if self.where is not None:
            for nbytes, ref in self.made.values():
                if ref() is not None:
                    self.bytes[self.where[0]] += nbytes
        self.where, self.launched, self.read, self.made = None, False, set(), {}

    def at(self, phase: str) -> None:
        """Any op of the step, kernel or not: the first of another phase ends the region (what the forward or the
        backward made and is alive as it ends is written; not later, when frees between phases have run)."""
        if self.where is not None and self.where[0] != phase:
            self.close()

    def fusible(self, phase: str, block: str, inputs: list, outputs: list, launches: int, unread: int = 0) -> None:
        """A memory-bound op of a compiled phase inside `block` (`launches`: its eager kernels; `unread`: bytes of an
        indexed operand it does not read, ops.py `_unread_bytes`)."""
        if self.where != (phase, block):
            self.close()
            self.where = (phase, block)
        from_memory = 0
        for t in inputs:
            st = t.untyped_storage()
            key = id(st)
            mine = self.made.get(key)
            if (mine is not None and mine[1]() is st) or key in self.read:
                continue  # made in this region (in registers) or read by it already
            self.read.add(key)
            from_memory += touched_bytes(t)
        self.bytes[phase] += max(from_memory - unread, 0)
        for t in outputs:
            st = t.untyped_storage()
            self.made[id(st)] = (touched_bytes(t), weakref.ref(st))
        self.eager_kernels[phase] += launches
        if launches and not self.launched:
            self.kernels[phase] += 1
            self.launched = True


def block_of(module: str) -> str:
    """The block a module path is in: up to its first numbered part (`model.layers.3.mlp.up_proj` ->
    `model.layers.3`), "" outside every module list."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[:i + 1])
    return ""


def touched_bytes(t) -> int:
    """Bytes a kernel touches in `t`: its elements, but no more than its storage (a broadcast view reads its small
    storage again and again from cache)."""
    nbytes = t.numel() * t.element_size()
    try:
        return min(nbytes, t.untyped_storage().nbytes())
    except Exception:  # noqa: BLE001 - tensors without storage (sparse, nested)
        return nbytes
