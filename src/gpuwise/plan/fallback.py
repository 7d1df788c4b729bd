"""When a fake trace cannot run the step: get the estimate another way, and say which.

Order of attempts (the first that works is used; `MemoryTrace.method` names it):
1. "fake-trace": fake tensors, no memory (plan/trace.py). A model whose *construction* reads data is
   built with real weights and copied into fake tensors; that is still a fake trace of the step.
2. "real-trace": the same tracer on real CPU tensors, so data-dependent ops (`.item()`, `torch.all(x)`
   checks, nonzero / dynamic shapes) just run. It costs real host memory, so it first traces batch 1
   and 2 and extrapolates every event's size linearly to the requested batch; when that predicts a peak
   under `REAL_TRACE_RAM_FRACTION` of the available host memory, it traces the requested batch itself.
3. "real-trace-extrapolated": the extrapolated events, when the requested batch would not fit in RAM
   (or its event sequence differs from batch 1 and 2's, e.g. a data-dependent number of steps).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from .events import MemoryTrace, live_peak

# a tracer bound to one workload, config, target and warm-up: batch size -> trace (plan/trace.py's run_fake
# and run_real); passed in, so that this module needs nothing from the tracer that calls it
TraceAt = Callable[[int], MemoryTrace]

# exceptions from fake tensors that mean "needs real data", not "the user's model is broken"
FAKE_LIMITS = ("DataDependentOutputException", "DynamicOutputShapeException", "UnsupportedOperatorException",
               "GuardOnDataDependentSymNode", "UnsupportedFakeTensorException")
REAL_TRACE_RAM_FRACTION = 0.25  # at most a quarter of the free host memory for a real trace


def is_fake_limit(exc: BaseException) -> bool:
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 8:
        if type(e).__name__ in FAKE_LIMITS:
            return True
        e = e.__cause__ or e.__context__
        seen += 1
    return False


def trace_with_fallback(fake: TraceAt, real: TraceAt, batch_size: int) -> MemoryTrace:
    """`fake(batch_size)`; when fake tensors cannot run the step, `real_trace(real, batch_size)`."""
    try:
        return fake(batch_size)
    except Exception as exc:  # noqa: BLE001 - decide below whether a fallback applies
        if not is_fake_limit(exc):
            raise
        why = f"fake tensors could not run the step ({type(exc).__name__}): traced on real CPU tensors"
    trace = real_trace(real, batch_size)
    trace.notes.insert(0, why)
    return trace


def real_trace(real: TraceAt, batch_size: int) -> MemoryTrace:
    """`real(batch_size)`, or the events extrapolated from batch 1 and 2 when that would not fit in RAM."""
    if batch_size <= 2:
        return real(batch_size)
    one = real(1)
    two = real(2)
    guess = extrapolate(one, two, batch_size)
    if guess is not None and live_peak(guess).allocated_bytes > REAL_TRACE_RAM_FRACTION * _available_bytes():
        return guess
    return real(batch_size)


def extrapolate(one: MemoryTrace, two: MemoryTrace, batch_size: int) -> MemoryTrace | None:
    """Events at `batch_size` from the same events at batch 1 and 2 (sizes linear in the batch);
    None when the two traces do not line up event by event."""
    if len(one.events) != len(two.events) or one.steady_start != two.steady_start:
        return None
    events = []
    for a, b in zip(one.events, two.events, strict=True):
        if (a.action, a.block, a.op) != (b.action, b.block, b.op):
            return None
        events.append(replace(b, nbytes=max(a.nbytes + (b.nbytes - a.nbytes) * (batch_size - 1), 0)))
    flops = one.flops_per_step + (two.flops_per_step - one.flops_per_step) * (batch_size - 1)
    notes = list(two.notes) + [f"sizes extrapolated linearly from real traces at batch 1 and 2 to {batch_size}"]
    return MemoryTrace(events, two.steady_start, two.device_type, "real-trace-extrapolated", notes, flops)


def _available_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().available)
