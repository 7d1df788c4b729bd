"""A trace on a CUDA device: + library workspaces and the context (overheads.py), replayed through the
caching-allocator model (allocator.py). What nvidia-smi would show is the most ever reserved plus what
lives outside the allocator.

Given the bytes the card offers (`limit_bytes`), a step whose free replay reserves more is replayed again
under that cap, as the real allocator runs it: a cudaMalloc that fails frees every cached segment and tries
once more (`release_cached_blocks`), and only a request that still fails is out of memory. A step that runs
so is what the card shows (reserved at most the cap) and counts its retries; one that does not keeps the
free replay's numbers (what it would need)."""

from __future__ import annotations

from dataclasses import dataclass

from ...units import fmt_bytes
from .allocator import AllocatorResult, replay
from .events import MemoryTrace, built_on_the_host
from .overheads import Overheads, add_workspaces

STEADY_REPEATS = 3  # steady steps replayed in a row: a measurement runs several; layouts can drift for a few
RETRIES_NOTE = "allocator: with room"  # how `retries_note` begins (fit's table marks those options by it)


@dataclass(frozen=True)
class CudaMemory:
    trace: MemoryTrace
    overheads: Overheads
    result: AllocatorResult
    # the replay with room to cache (no cap), where a cap changed the result: the step runs under the cap
    # only by freeing the cache (retries), and this is what it reserves given room
    free: AllocatorResult | None = None

    @property
    def device_used_bytes(self) -> int:
        # nvidia-smi sees the most ever reserved (cached segments are not returned without empty_cache)
        return self.result.max_reserved_bytes + self.overheads.outside_allocator_bytes


def cuda_memory(trace: MemoryTrace, arch: str, loading: str | None = None,
                limit_bytes: int | None = None, roomy: AllocatorResult | None = None,
                nccl_bytes: int = 0) -> CudaMemory:
    """`loading`: how the CUDA context loads modules (overheads.py `add_workspaces`); `limit_bytes`: the
    device bytes the step may use (the card's memory less any margin), None for a replay with room; `roomy`:
    the replay with room of the same trace, arch and loading where it ran already (not run again);
    `nccl_bytes`: a data-parallel rank's NCCL buffers (nccl.py), outside the allocator as the context."""
    with_ws, overheads = add_workspaces(built_on_the_host(trace), arch, loading=loading, nccl_bytes=nccl_bytes)
    result, free = replay_within(with_ws, overheads, limit_bytes, STEADY_REPEATS, roomy)
    return CudaMemory(with_ws, overheads, result, free=free)


def replay_within(with_ws: MemoryTrace, overheads: Overheads, limit_bytes: int | None, steady_repeats: int,
                  roomy: AllocatorResult | None = None) -> tuple[AllocatorResult, AllocatorResult | None]:
    """(the replay of `with_ws` (workspaces added) as it runs on a card offering `limit_bytes`, the replay with
    room where that differs: the step runs under the cap only by retrying) (the module's docstring). `roomy`:
    the replay with room, where it ran already."""
    free = roomy if roomy is not None else replay(with_ws, steady_repeats=steady_repeats)
    if limit_bytes is None or free.max_reserved_bytes + overheads.outside_allocator_bytes <= limit_bytes:
        return free, None
    cap = limit_bytes - overheads.outside_allocator_bytes
    if cap <= 0 or free.peak_requested_bytes > cap:  # reserved holds at least what is asked: out of memory
        return free, None
    capped = replay(with_ws, capacity_bytes=cap, steady_repeats=steady_repeats)
    return (free, None) if capped.oom else (capped, free)


def retries_note(c: CudaMemory) -> str:
    """The note of a step that runs under its limit only by freeing the allocator's cache."""
    need = (c.free or c.result).max_reserved_bytes + c.overheads.outside_allocator_bytes
    steady = (f"{c.result.steady_retries} in the steady ones (each frees every cached segment and synchronises the "
              "device; the predicted speed leaves them out)" if c.result.steady_retries else
              "none in the steady ones (the speed is not affected)")
    return (f"{RETRIES_NOTE} the step would hold {fmt_bytes(need)} of device memory; under the limit the "
            "caching allocator runs it by freeing its cache and retrying a failed cudaMalloc (PyTorch's "
            f"'cudaMalloc retries'): {c.result.retries} over the first step and {STEADY_REPEATS} steady ones, "
            f"{steady}. PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is PyTorch's setting against this "
            "fragmentation")
