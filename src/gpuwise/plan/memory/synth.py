"""A training step's memory events at an untraced batch size, from two traced ones.

Two traces of the same step at batch sizes a and c usually hold the same events in the same order (same
ops, same blocks freed in the same places); only the sizes differ, and each size is affine in the batch
(`n = fixed + per_sample * b`: a tensor's bytes are its batch dimension times the rest). So event i's
size at batch b is the line through its sizes at a and c: every event its own piece, a finer piecewise
model than one line per phase. Replaying the result through the caching-allocator model (a replay costs
~2 % of a trace) puts the allocator's block rounding, 2/20 MiB segment steps and its non-monotone layout
where they fall, which no line can; plan/capacity.py searches these replays for the crossing and then traces
only b and b + 1 to settle it. Where a size is not affine in b (a kernel choosing its workspace by size,
data-dependent shapes) the replay is off, and the traces catch it: the answer is always traced.
"""

from __future__ import annotations

import dataclasses

from .events import MemoryTrace


def pairing(ta: MemoryTrace, tc: MemoryTrace) -> dict[int, int] | None:
    """Block of `ta` -> block of `tc` when the two traces are the same step: allocations in the same
    order with the same category, phase, op and stream, and frees in the same places, where a run of
    frees between two allocations may free its blocks in another order (the autocast weight cache is
    cleared in dict order; after the run the allocator holds the same free blocks either way). None when
    they differ."""
    if len(ta.events) != len(tc.events) or ta.steady_start != tc.steady_start:
        return None
    pair: dict[int, int] = {}
    run_a: list[int] = []
    run_c: list[int] = []

    def same_run() -> bool:
        ok = {pair.get(b, b) for b in run_a} == set(run_c)
        run_a.clear()
        run_c.clear()
        return ok

    for i, (x, y) in enumerate(zip(ta.events, tc.events, strict=True)):
        if x.action != y.action or (i == ta.steady_start and not same_run()):
            return None
        if x.action == "alloc":
            if not same_run() or (x.category, x.phase, x.op, x.stream) != (y.category, y.phase, y.op, y.stream):
                return None
            pair[x.block] = y.block
        else:
            run_a.append(x.block)
            run_c.append(y.block)
    return pair if same_run() else None


def same_structure(ta: MemoryTrace, tc: MemoryTrace) -> bool:
    """True when `pairing` pairs the two traces' events."""
    return pairing(ta, tc) is not None


def interpolate(ta: MemoryTrace, a: int, tc: MemoryTrace, c: int, b: int,
                pair: dict[int, int] | None = None) -> MemoryTrace:
    """`ta`'s events with each block's size on the line through its sizes at batch `a` and at batch `c`
    (`pair`: `pairing(ta, tc)`, computed when not given; the traces must pair), evaluated at batch `b`
    (rounded to the nearest byte, >= 0)."""
    if a == c:
        raise ValueError("two different batch sizes are needed")
    pair = pairing(ta, tc) if pair is None else pair
    if pair is None:
        raise ValueError("the two traces are not the same step (plan/memory/synth.py pairing)")
    size_c = {ev.block: ev.nbytes for ev in tc.events if ev.action == "alloc"}
    size: dict[int, int] = {}
    events = []
    for x in ta.events:
        if x.action == "alloc":
            y = size_c[pair[x.block]]
            n = x.nbytes if y == x.nbytes else max(0, round(x.nbytes + (y - x.nbytes) * (b - a) / (c - a)))
            size[x.block] = n
        else:
            n = size.get(x.block, x.nbytes)
        events.append(x if n == x.nbytes else dataclasses.replace(x, nbytes=n))
    return MemoryTrace(events, ta.steady_start, ta.device_type, ta.method, list(ta.notes), ta.flops_per_step)
