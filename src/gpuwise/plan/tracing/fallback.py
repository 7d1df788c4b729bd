"""When a fake trace cannot run the step: get the estimate another way, and say which.

Order of attempts (the first that works is used; `MemoryTrace.method` names it):
1. "fake-trace": fake tensors, no memory (plan/tracing/trace.py). A model whose *construction* reads data is
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

from ...errors import GpuwiseError, first_line
from ..memory.events import MemoryTrace, live_peak

# a tracer bound to one workload, config, target and warm-up: batch size -> trace (plan/tracing/trace.py's run_fake
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


def trace_with_fallback(fake: TraceAt, real: TraceAt, batch_size: int, workload) -> MemoryTrace:
    """`fake(batch_size)`; when it fails for any reason but a bad workload (a data-dependent op, a fake or
    meta kernel stricter than the CPU one, e.g. `_grouped_mm` asking for bf16), `real_trace(real, ...)`,
    with a note saying why. If the real step fails too with the same error, it is the user's and is raised;
    with another one (the real tensors' own limit: a CUDA-only kernel the trace runs as the GPU would), the
    answer is "cannot tell", with both errors."""
    try:
        return fake(batch_size)
    except GpuwiseError:
        raise
    except Exception as exc:  # noqa: BLE001 - any limit of fake tensors: try real ones
        kind = "needs real data" if is_fake_limit(exc) else "fake tensors failed"
        first = first_line(exc)[:160]
        why = f"fake tensors could not run the step ({kind}: {type(exc).__name__}: {first}): traced on real CPU tensors"
        cause = exc
    check_fits_in_ram(workload, why.split(': traced')[0])
    try:
        trace = real_trace(real, batch_size)
    except GpuwiseError:
        raise
    except Exception as exc:
        if type(exc) is type(cause) and first_line(exc) == first_line(cause):
            raise exc from cause  # the workload's own error, whichever tensors run it
        raise GpuwiseError(f"cannot tell: {why.split(': traced')[0]}, and on real CPU tensors it raised "
                           f"{type(exc).__name__}: {first_line(exc)[:160]}") from exc
    trace.notes.insert(0, why)
    return trace


def check_fits_in_ram(workload, why: str, copies: int = 4) -> None:
    """Real tensors of the model hold `copies` x its parameter bytes in host memory (a real-tensor trace: the
    parameters, their gradients and two Adam moments; building it with real weights: 1): refuse ("cannot
    tell: {why}", one line) rather than swap or be killed when they would not fit."""
    try:
        import torch

        with torch.device("meta"):
            model = workload.build_model()
        param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    except Exception:  # noqa: BLE001 - a model that cannot be built on meta: let the real tensors try
        return
    need = copies * param_bytes
    if need > REAL_TRACE_RAM_FRACTION * _available_bytes():
        what = "a real-tensor trace" if copies > 1 else "building it with real weights"
        raise GpuwiseError(f"cannot tell: {why}, and {what} would need about {need / 2**30:.1f} GiB of host "
                           f"memory (more than {REAL_TRACE_RAM_FRACTION:.0%} of what is free)")


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
