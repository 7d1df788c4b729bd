"""A training step's memory events at an untraced batch size, from two traced ones.

Two traces of the same step at batch sizes a and c usually hold the same events in the same order (same
ops, same blocks freed in the same places); only the sizes differ, and each size is affine in the batch
(`n = fixed + per_sample * b`: a tensor's bytes are its batch dimension times the rest). So event i's
size at batch b is the line through its sizes at a and c: every event its own piece, a finer piecewise
model than one line per phase. Replaying the result through the caching-allocator model (a replay costs
~2 % of a trace) puts the allocator's block rounding, 2/20 MiB segment steps and its non-monotone layout
where they fall, which no line can; plan/curve.py searches these replays for the crossing and then traces
only b and b + 1 to settle it. Where a size is not affine in b (a kernel choosing its workspace by size,
data-dependent shapes) the replay is off, and the traces catch it: the answer is always traced.
"""

from __future__ import annotations

import dataclasses

from .events import MemoryTrace


def same_structure(ta: MemoryTrace, tc: MemoryTrace) -> bool:
    """True when the two traces hold the same events in the same order (action, category, phase, op,
    stream) with the same block pairing, so that event i of one is event i of the other."""
    if len(ta.events) != len(tc.events) or ta.steady_start != tc.steady_start:
        return False
    pairing: dict[int, int] = {}
    for x, y in zip(ta.events, tc.events, strict=True):
        if (x.action, x.category, x.phase, x.op, x.stream) != (y.action, y.category, y.phase, y.op, y.stream):
            return False
        if pairing.setdefault(x.block, y.block) != y.block:
            return False
    return True


def interpolate(ta: MemoryTrace, a: int, tc: MemoryTrace, c: int, b: int) -> MemoryTrace:
    """`ta`'s events with each size on the line through its sizes at batch `a` and at batch `c` (traces
    of the same structure, `same_structure`), evaluated at batch `b` (rounded to the nearest byte, >= 0)."""
    if a == c:
        raise ValueError("two different batch sizes are needed")
    events = []
    for x, y in zip(ta.events, tc.events, strict=True):
        if x.nbytes == y.nbytes:
            events.append(x)
            continue
        n = x.nbytes + (y.nbytes - x.nbytes) * (b - a) / (c - a)
        events.append(dataclasses.replace(x, nbytes=max(0, round(n))))
    return MemoryTrace(events, ta.steady_start, ta.device_type, ta.method, list(ta.notes), ta.flops_per_step)
