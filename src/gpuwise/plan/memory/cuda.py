"""A trace on a CUDA device: + library workspaces and the context (overheads.py), replayed through the
caching-allocator model (allocator.py). What nvidia-smi would show is the most ever reserved plus what
lives outside the allocator."""

from __future__ import annotations

from dataclasses import dataclass

from .allocator import AllocatorResult, replay
from .events import MemoryTrace
from .overheads import Overheads, add_workspaces

STEADY_REPEATS = 3  # steady steps replayed in a row: a measurement runs several; layouts can drift for a few


@dataclass(frozen=True)
class CudaMemory:
    trace: MemoryTrace
    overheads: Overheads
    result: AllocatorResult

    @property
    def device_used_bytes(self) -> int:
        # nvidia-smi sees the most ever reserved (cached segments are not returned without empty_cache)
        return self.result.max_reserved_bytes + self.overheads.outside_allocator_bytes


def cuda_memory(trace: MemoryTrace, arch: str, loading: str | None = None) -> CudaMemory:
    """`loading`: how the CUDA context loads modules (overheads.py `add_workspaces`)."""
    with_ws, overheads = add_workspaces(trace, arch, loading=loading)
    return CudaMemory(with_ws, overheads, replay(with_ws, steady_repeats=STEADY_REPEATS))
