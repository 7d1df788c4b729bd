"""A model of PyTorch's CUDA caching allocator, replayed over a MemoryTrace.

Follows c10/cuda/CUDACachingAllocator.cpp (DeviceCachingAllocator, default settings: no
expandable segments, max_split_size unlimited, no garbage-collection threshold):

- every request is rounded up to a multiple of 512 bytes (`round_size`, kMinBlockSize = 512);
- requests <= 1 MiB (kSmallSize) come from the small pool, the rest from the large pool (`get_pool`);
- a new segment (one cudaMalloc) is 2 MiB (kSmallBuffer) for small requests, 20 MiB (kLargeBuffer) for
  requests under 10 MiB (kMinLargeAlloc), else the request rounded up to 2 MiB (kRoundLarge)
  (`get_allocation_size`);
- a cached free block is chosen best-fit: the smallest block of the same stream whose size is at least
  the request, ties broken by address (`BlockComparatorSize`, `get_free_block`; segments are laid out in
  ascending order unless the driver's addresses are given: a measured trace's, which need not ascend); blocks of
  max_split_size or more only serve requests of max_split_size or more, within +20 MiB;
- a chosen block is split when the rest is >= 512 bytes (small pool) or > 1 MiB (large pool, and the
  request is below max_split_size) (`should_split`); the request takes the front, the rest stays cached;
- a freed block merges with free neighbours of its segment (`free_block`, `try_merge_blocks`);
- when cudaMalloc fails (here: reserved + segment > capacity), free every cached segment that is not
  split and retry (`release_cached_blocks`), else out of memory.

`allocated_bytes` counts block sizes, as `torch.cuda.memory_allocated()` does (`stats.allocated_bytes
.increase(block->size)`): an unsplit block counts whole, e.g. 11 MiB asked of a fresh 12 MiB segment
counts 12 MiB, because a 1 MiB rest is not > kSmallSize and so is not split off.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from .events import MemEvent, MemoryTrace

# c10/cuda/CUDACachingAllocator.cpp constants
K_MIN_BLOCK_SIZE = 512                  # kMinBlockSize: all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1048576                  # kSmallSize: largest "small" allocation is 1 MiB
K_SMALL_BUFFER = 2097152                # kSmallBuffer: "small" allocations are packed in 2 MiB blocks
K_LARGE_BUFFER = 20971520               # kLargeBuffer: "large" allocations may be packed in 20 MiB blocks
K_MIN_LARGE_ALLOC = 10485760            # kMinLargeAlloc: allocations between 1 and 10 MiB may use kLargeBuffer
K_ROUND_LARGE = 2097152                 # kRoundLarge: round up large allocations to 2 MiB
NO_MAX_SPLIT = 2**64 - 1                # CUDAAllocatorConfig::max_split_size() default: SIZE_MAX


def round_size(nbytes: int) -> int:
    """`round_size`: at least 512 bytes, else up to a multiple of 512 (roundup_power2_divisions off)."""
    if nbytes < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    return K_MIN_BLOCK_SIZE * ((nbytes + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def segment_size(rounded_bytes: int) -> int:
    """`get_allocation_size`: the cudaMalloc size for a request that found no cached block."""
    if rounded_bytes <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if rounded_bytes < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((rounded_bytes + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


class _Block:
    __slots__ = ("addr", "size", "stream", "small", "allocated", "prev", "next", "requested")

    def __init__(self, addr: int, size: int, stream: int, small: bool):
        self.addr, self.size, self.stream, self.small = addr, size, stream, small
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.requested = 0

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


ADDR_BITS = 64  # a free block's order key is size << ADDR_BITS | address: virtual addresses stay below 2**64


class _Pool:
    """Free cached blocks ordered by (stream, size, address): `BlockComparatorSize`.

    One sorted list per stream (a request only looks at its own stream's blocks), of one int per block,
    size << ADDR_BITS | address, which sorts as (size, address) does and bisects faster than a tuple."""

    __slots__ = ("small", "keys", "blocks")

    def __init__(self, small: bool):
        self.small = small
        self.keys: dict[int, list[int]] = {}   # stream -> sorted keys of its free blocks
        self.blocks: dict[int, _Block] = {}    # key -> block (addresses are unique, so keys are)

    def insert(self, b: _Block) -> None:
        k = b.size << ADDR_BITS | b.addr
        keys = self.keys.get(b.stream)
        if keys is None:
            keys = self.keys[b.stream] = []
        bisect.insort(keys, k)
        self.blocks[k] = b

    def remove(self, b: _Block) -> None:
        k = b.size << ADDR_BITS | b.addr
        keys = self.keys[b.stream]
        del keys[bisect.bisect_left(keys, k)]
        del self.blocks[k]


@dataclass(frozen=True)
class AllocatorResult:
    """What `torch.cuda.memory_stats()` would say after the replay (peaks over the steady-state step)."""

    peak_allocated_bytes: int       # max of memory_allocated (block sizes) during the steady-state step
    peak_reserved_bytes: int        # max of memory_reserved during the steady-state step
    peak_requested_bytes: int       # max of the bytes asked for (unrounded) during the steady-state step
    max_reserved_bytes: int         # max of memory_reserved over the whole replay (setup included)
    max_allocated_bytes: int        # max of memory_allocated over the whole replay
    segments: int                   # cudaMalloc calls that succeeded
    retries: int                    # cudaMalloc failures that freed cached segments and retried
    oom: bool                       # a request could not be served even after freeing the cache
    oom_event_index: int | None
    oom_request_bytes: int = 0
    fragmentation: float = 0.0      # 1 - allocated/reserved at the steady-state peak of reserved
    steady_retries: int = 0         # of `retries`, those of the steady-state steps (events[steady_start:])
    # max of memory_allocated during the steady-state step, per phase of the event (plan/curve.py fits
    # each phase's peak as its own line in the batch size: the peak moves from the optimizer step to backward)
    phase_peak_allocated_bytes: dict[str, int] = field(default_factory=dict)
    timeline: list[tuple[int, int, int]] = field(default_factory=list, repr=False)  # (event, allocated, reserved)

    @property
    def cached_free_bytes(self) -> int:
        return self.peak_reserved_bytes - self.peak_allocated_bytes


class CachingAllocator:
    """The allocator's state: segments, free pools and statistics. `malloc`/`free` mirror the C++."""

    def __init__(self, capacity_bytes: int | None = None, max_split_size_bytes: int | None = None,
                 segment_addresses: Sequence[int] = ()):
        self.capacity_bytes = capacity_bytes
        self.max_split = max_split_size_bytes or NO_MAX_SPLIT
        self.small, self.large = _Pool(True), _Pool(False)
        self.reserved_bytes = 0
        self.allocated_bytes = 0
        self.requested_bytes = 0
        self.segments = 0
        self.retries = 0
        self._next_addr = 1 << 40  # virtual addresses: segments laid out one after the other
        # ... unless the addresses cudaMalloc returned are known (a measured trace): best fit breaks ties
        # between equal-size free blocks by address, and the driver's addresses need not ascend
        self._given, self._given_i = list(segment_addresses), 0
        self._heads: dict[int, _Block] = {}  # segment address -> its first block, for every live segment

    # -- malloc -------------------------------------------------------------------------------------
    def malloc(self, nbytes: int, stream: int = 0) -> _Block | None:
        """A block for `nbytes`, or None when out of memory. The hot path of a replay: `get_free_block`
        and `alloc_found_block` are written out here rather than called."""
        size = round_size(nbytes)
        pool = self.small if size <= K_SMALL_SIZE else self.large
        max_split = self.max_split
        # get_free_block: the best fit among this stream's free blocks, within max_split_size's limits
        block = None
        keys = pool.keys.get(stream)
        if keys:
            i = bisect.bisect_left(keys, size << ADDR_BITS)
            if i < len(keys):
                block = pool.blocks[keys[i]]
                if size < max_split and block.size >= max_split:
                    block = None  # "Do not return an oversized block for a large request"
                elif size >= max_split and block.size >= size + K_LARGE_BUFFER:
                    block = None  # "Allow oversized block size to be rounded up but within a limit"
                else:
                    del pool.blocks[keys.pop(i)]
        if block is None:
            block = self._alloc_segment(pool, stream, size)
            if block is None:  # release_cached_blocks() and retry, as `malloc` does after a failed cudaMalloc
                self.retries += 1
                self._release_cached_blocks()
                block = self._alloc_segment(pool, stream, size)
                if block is None:
                    return None
        # alloc_found_block: the request takes the front; should_split: the rest stays cached when it is
        # >= 512 bytes (small pool) or > 1 MiB (large pool, a request below max_split_size)
        remaining = block.size - size
        if (remaining >= K_MIN_BLOCK_SIZE) if block.small else (size < max_split and remaining > K_SMALL_SIZE):
            rest = _Block(block.addr + size, remaining, block.stream, block.small)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            pool.insert(rest)
        block.allocated = True
        block.requested = nbytes
        self.allocated_bytes += block.size
        self.requested_bytes += nbytes
        return block

    def _alloc_segment(self, pool: _Pool, stream: int, size: int) -> _Block | None:
        seg = segment_size(size)
        if self.capacity_bytes is not None and self.reserved_bytes + seg > self.capacity_bytes:
            return None
        if self._given_i < len(self._given):
            addr, self._given_i = self._given[self._given_i], self._given_i + 1
        else:
            addr, self._next_addr = self._next_addr, self._next_addr + seg
        block = _Block(addr, seg, stream, pool.small)
        self.reserved_bytes += seg
        self.segments += 1
        self._heads[block.addr] = block
        return block

    # -- free ---------------------------------------------------------------------------------------
    def free(self, block: _Block) -> None:
        block.allocated = False
        self.allocated_bytes -= block.size
        self.requested_bytes -= block.requested
        pool = self.small if block.small else self.large
        for other in (block.prev, block.next):
            if other is None or other.allocated:
                continue
            k = other.size << ADDR_BITS | other.addr  # pool.remove(other), written out
            keys = pool.keys[other.stream]
            del keys[bisect.bisect_left(keys, k)]
            del pool.blocks[k]
            if other is block.prev:  # [other block]
                block.addr = other.addr
                block.prev = other.prev
                if block.prev is not None:
                    block.prev.next = block
                else:  # block is now its segment's first block
                    self._heads[block.addr] = block
            else:                    # [block other]
                block.next = other.next
                if block.next is not None:
                    block.next.prev = block
            block.size += other.size
        pool.insert(block)

    def _release_cached_blocks(self) -> None:
        """`release_cached_blocks`: cudaFree every cached segment that is not split (one free block)."""
        for addr, head in list(self._heads.items()):
            if not head.allocated and not head.is_split():
                (self.small if head.small else self.large).remove(head)
                self.reserved_bytes -= head.size
                del self._heads[addr]


def repeat_steady(trace: MemoryTrace, times: int) -> MemoryTrace:
    """`trace` with its steady-state step run `times` times in a row, as a measurement runs several steps.

    The allocator's layout (and so reserved memory and unsplit-block sizes) can keep changing for a few
    steps. A steady step frees some blocks of the step before (the previous loss, say) and leaves some of
    its own alive for the next; those are paired by (size, category) in order, so that repetition r frees
    what repetition r - 1 left. Frees of earlier blocks with no partner happen in the first repetition only.
    """
    if times <= 1 or trace.steady_start >= len(trace.events):
        return trace
    events = list(trace.events)
    step, first_blocks, offset = _repetition(trace)
    for r in range(1, times):
        for ev, b in zip(step, first_blocks):
            # the event with its block renumbered (a constructor call: dataclasses.replace cost ~40% of a replay)
            events.append(MemEvent(ev.action, b + offset * (r - 1), ev.nbytes, ev.category, ev.phase, ev.module,
                                   ev.op, ev.stream))
    return MemoryTrace(events, trace.steady_start, trace.device_type, trace.method, list(trace.notes))


def _repetition(trace: MemoryTrace) -> tuple[list[MemEvent], list[int], int]:
    """How `repeat_steady` repeats the steady step: the steady events that repeat, their blocks in
    repetition 1, and the offset: repetition r's blocks are repetition 1's + offset * (r - 1)."""
    steady = trace.events[trace.steady_start:]
    allocated = {ev.block for ev in steady if ev.action == "alloc"}
    freed = {ev.block for ev in steady if ev.action == "free"}
    carried = [ev for ev in steady if ev.action == "alloc" and ev.block not in freed]
    inherited = [ev for ev in steady if ev.action == "free" and ev.block not in allocated]
    partner: dict[int, int] = {}  # inherited block -> the carried block that plays its part one step later
    pool: dict[tuple[int, str], list[int]] = {}
    for ev in carried:
        pool.setdefault((ev.nbytes, ev.category), []).append(ev.block)
    for ev in inherited:
        candidates = pool.get((ev.nbytes, ev.category))
        if candidates:
            partner[ev.block] = candidates.pop(0)
    offset = max(ev.block for ev in trace.events) + 1
    step: list[MemEvent] = []
    blocks: list[int] = []
    for ev in steady:
        if ev.block in allocated:
            step.append(ev)
            blocks.append(ev.block + offset)
        elif ev.block in partner:  # free what the previous repetition left for this one
            step.append(ev)
            blocks.append(partner[ev.block])
    return step, blocks, offset


class _Replay:
    """A replay in progress: the allocator, the block behind each live trace block, the statistics."""

    def __init__(self, capacity_bytes: int | None, max_split_size_bytes: int | None, steady_start: int,
                 keep_timeline: bool, segment_addresses: Sequence[int] = ()):
        self.alloc = CachingAllocator(capacity_bytes, max_split_size_bytes, segment_addresses)
        self.live: dict[int, _Block] = {}
        self.steady_start = steady_start
        self.keep_timeline = keep_timeline
        self.peak_alloc = self.peak_res = self.peak_req = self.max_res = self.max_alloc = 0
        self.frag_at_peak_res = 0.0
        self.phase_peaks: dict[str, int] = {}
        self.timeline: list[tuple[int, int, int]] = []
        self.oom_at: int | None = None
        self.oom_bytes = 0

    def run(self, events: list[MemEvent], blocks: list[int], first: int) -> bool:
        """Replay `events` (event index `first` onwards), each on its block in `blocks`; False on OOM."""
        alloc, live, steady_start, keep_timeline = self.alloc, self.live, self.steady_start, self.keep_timeline
        malloc, free = alloc.malloc, alloc.free
        peak_alloc, peak_res, peak_req = self.peak_alloc, self.peak_res, self.peak_req
        max_res, max_alloc, frag_at_peak_res = self.max_res, self.max_alloc, self.frag_at_peak_res
        phase_peaks, timeline = self.phase_peaks, self.timeline
        ok = True
        # the hot loop of fit and estimate (hundreds of thousands of events): plain comparisons, not max()
        for i, ev, b in zip(range(first, first + len(events)), events, blocks):
            if ev.action == "alloc":
                if ev.nbytes <= 0:
                    continue  # malloc(0) hands out nullptr without touching the pools
                block = malloc(ev.nbytes, ev.stream)
                if block is None:
                    self.oom_at, self.oom_bytes = i, ev.nbytes
                    ok = False
                    break
                live[b] = block
            else:
                block = live.pop(b, None)
                if block is None:
                    continue
                free(block)
            allocated, reserved = alloc.allocated_bytes, alloc.reserved_bytes
            if reserved > max_res:
                max_res = reserved
            if allocated > max_alloc:
                max_alloc = allocated
            if i >= steady_start:
                if allocated > peak_alloc:
                    peak_alloc = allocated
                if allocated > phase_peaks.get(ev.phase, -1):
                    phase_peaks[ev.phase] = allocated
                if alloc.requested_bytes > peak_req:
                    peak_req = alloc.requested_bytes
                if reserved > peak_res:
                    peak_res = reserved
                    frag_at_peak_res = 1.0 - allocated / reserved
            if keep_timeline:
                timeline.append((i, allocated, reserved))
        self.peak_alloc, self.peak_res, self.peak_req = peak_alloc, peak_res, peak_req
        self.max_res, self.max_alloc, self.frag_at_peak_res = max_res, max_alloc, frag_at_peak_res
        return ok

    def state(self, blocks: list[int]) -> tuple:
        """All that the replay of a step on `blocks` depends on: every segment's blocks (the free pools
        hold exactly the free ones), the totals, the next segment's address (or given address), and the block behind each
        of `blocks` (None: not live)."""
        alloc, live = self.alloc, self.live
        segments = []
        for addr in sorted(alloc._heads):
            b: _Block | None = alloc._heads[addr]
            seg = []
            while b is not None:
                seg.append((b.addr, b.size, b.stream, b.small, b.allocated, b.requested))
                b = b.next
            segments.append(tuple(seg))
        named = [None if (x := live.get(b)) is None else x.addr for b in blocks]
        return (alloc._next_addr, alloc._given_i, alloc.reserved_bytes, alloc.allocated_bytes, alloc.requested_bytes,
                segments, named)


def replay(trace: MemoryTrace, capacity_bytes: int | None = None, max_split_size_bytes: int | None = None,
           keep_timeline: bool = False, steady_repeats: int = 1) -> AllocatorResult:
    """Replay every event of `trace` through the allocator model; peaks are over `events[steady_start:]`
    (with `steady_repeats` > 1, over that many steady steps in a row, as `repeat_steady` makes them).

    Exact shortcut: once a repeated step starts from the same state as the step before it (`_Replay.state`:
    the same segments, blocks and addresses, and its blocks naming the same live blocks), it replays
    exactly as that step did, and so does every later one: the peaks, segments and retries stay as they
    are (that step made no cudaMalloc: the next segment's address is in the state), and the timeline
    repeats that step's. Block ids must be >= 0 for that (so that repetition r's blocks, r * offset
    onwards, name nothing earlier); else every step is replayed."""
    events, steady_start = trace.events, trace.steady_start
    rp = _Replay(capacity_bytes, max_split_size_bytes, steady_start, keep_timeline, trace.segment_addresses)
    ok = rp.run(events[:steady_start], [ev.block for ev in events[:steady_start]], 0)
    at_steady = rp.alloc.retries
    if ok and steady_repeats > 1 and steady_start < len(events):
        steady = events[steady_start:]
        step, first_blocks, offset = _repetition(trace)
        exact = min(ev.block for ev in events) >= 0
        # the first repetition replays the steady step itself when every steady event repeats
        before = rp.state([ev.block for ev in steady]) if exact and len(step) == len(steady) else None
        t0 = len(rp.timeline)
        ok = rp.run(steady, [ev.block for ev in steady], steady_start)
        start = len(events)
        for r in range(1, steady_repeats):
            if not ok:
                break
            blocks = first_blocks if r == 1 else [b + offset * (r - 1) for b in first_blocks]
            now = rp.state(blocks) if exact else None
            if now is not None and now == before:  # steps r.. replay exactly as step r - 1 did
                last = rp.timeline[t0:]
                for k in range(r, steady_repeats):
                    shift = (k - r + 1) * len(step)
                    rp.timeline.extend((i + shift, a, res) for i, a, res in last)
                break
            before, t0 = now, len(rp.timeline)
            ok = rp.run(step, blocks, start)
            start += len(step)
    elif ok:
        rp.run(events[steady_start:], [ev.block for ev in events[steady_start:]], steady_start)
    alloc = rp.alloc
    peak_alloc, peak_res = rp.peak_alloc, rp.peak_res
    if rp.oom_at is None and steady_start >= len(events):
        peak_alloc, peak_res = alloc.allocated_bytes, alloc.reserved_bytes
    return AllocatorResult(
        peak_allocated_bytes=peak_alloc, peak_reserved_bytes=peak_res, peak_requested_bytes=rp.peak_req,
        max_reserved_bytes=rp.max_res, max_allocated_bytes=rp.max_alloc, segments=alloc.segments,
        retries=alloc.retries, oom=rp.oom_at is not None, oom_event_index=rp.oom_at,
        oom_request_bytes=rp.oom_bytes, fragmentation=round(rp.frag_at_peak_res, 6),
        steady_retries=alloc.retries - at_steady,
        phase_peak_allocated_bytes=rp.phase_peaks, timeline=rp.timeline,
    )
