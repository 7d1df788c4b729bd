"""When a fake trace cannot run the step: get the estimate another way, and say which.

Order of attempts (the first that works is used; `MemoryTrace.method` names it):
1. "fake-trace": fake tensors, no memory (plan/trace.py).
2. "real-trace": the same tracer on real CPU tensors. Data-dependent ops (`.item()`, `torch.all(x)`
   checks, nonzero / dynamic shapes) just run. Costs real host memory and time, so it runs at the
   requested batch only when that is small enough, else at two smaller batches and the per-sample
   growth is extrapolated ("real-trace-extrapolated").
"""

from __future__ import annotations

from .events import MemoryTrace

# exceptions from fake tensors that mean "needs real data", not "the user's model is broken"
FAKE_LIMITS = ("DataDependentOutputException", "DynamicOutputShapeException", "UnsupportedOperatorException",
               "GuardOnDataDependentSymNode", "UnsupportedFakeTensorException")


def is_fake_limit(exc: BaseException) -> bool:
    for e in (exc, exc.__cause__, exc.__context__):
        if e is not None and type(e).__name__ in FAKE_LIMITS:
            return True
    return False


def trace_with_fallback(workload, batch_size: int, config, target: str) -> MemoryTrace:
    from .trace import _run_fake, _run_real

    try:
        return _run_fake(workload, batch_size, config, target)
    except Exception as exc:  # noqa: BLE001 - decide below whether a fallback applies
        if not is_fake_limit(exc):
            raise
        why = f"fake tensors could not run the step ({type(exc).__name__})"
    trace = _run_real(workload, batch_size, config, target)
    trace.notes.insert(0, why)
    return trace
