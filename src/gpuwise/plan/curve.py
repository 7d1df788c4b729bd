"""Memory vs batch size: a fixed part and a per-sample part, and the largest batch that fits a GPU.

Memory of a step is close to affine in the batch size (parameters, gradients, optimizer state and
workspaces are fixed; activations and inputs grow with each sample), but not exactly: the caching
allocator rounds blocks and segments. So the line is fitted from two traced points, checked on a
third, and used only as a *guess*; the answer is settled by tracing: the largest batch b that fits
with b + 1 not fitting, found by a search whose next candidate is a pure function of the last
batch that fitted and the first that did not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .. import bracket

MAX_BATCH = 1 << 20          # search ceiling: a million samples per step
DEFAULT_MARGIN_PCT = 5.0     # headroom kept free on the GPU: allocator growth across steps, other libraries


@dataclass(frozen=True)
class CurvePoint:
    batch_size: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    device_used_bytes: int


@dataclass(frozen=True)
class LinearFit:
    fixed_bytes: float
    per_sample_bytes: float

    def at(self, batch_size: int) -> float:
        return self.fixed_bytes + self.per_sample_bytes * batch_size

    def largest_within(self, limit_bytes: float) -> int:
        """Largest batch the line keeps within `limit_bytes` (MAX_BATCH when it does not grow)."""
        if self.per_sample_bytes <= 0:
            return MAX_BATCH if self.fixed_bytes <= limit_bytes else 0
        return max(0, min(MAX_BATCH, int((limit_bytes - self.fixed_bytes) // self.per_sample_bytes)))


def resolution(batch_size: int) -> int:
    """How exactly the largest batch is settled: to one sample up to 1000, then to 0.1% (tracing every
    sample of a 400,000-sample staircase of 2 MiB segments would cost ~20 traces for nothing useful)."""
    return max(1, batch_size // 1000)


def fit_line(a: tuple[int, int], b: tuple[int, int]) -> LinearFit:
    """The line through two (batch_size, bytes) points."""
    (x1, y1), (x2, y2) = sorted([a, b])
    if x1 == x2:
        return LinearFit(float(y1), 0.0)
    slope = (y2 - y1) / (x2 - x1)
    return LinearFit(y1 - slope * x1, slope)


def next_candidate(last_fit: int, first_fail: int | None, guess: int | None = None) -> int | None:
    """The next batch size to trace, from the largest known to fit (0: none) and the smallest known not to
    fit (None: none failed yet): gpuwise/bracket.py's search from 1, up to MAX_BATCH, trying `guess` first
    when it lies inside the bracket. None when the answer is settled (last_fit + 1 == first_fail)."""
    return bracket.next_candidate(last_fit or None, first_fail, 1, limit=MAX_BATCH, guess=guess)


@dataclass
class Capacity:
    """The largest batch that fits on a GPU and how it was found."""

    limit_bytes: int                      # GPU memory minus the margin: what device_used must stay under
    margin_pct: float
    max_batch_size: int                   # 0: not even one sample fits
    fits: bool                            # the asked batch fits
    fit: LinearFit
    check_batch_size: int | None          # where the line was checked against a trace
    check_error_pct: float | None         # line vs trace there
    points: list[CurvePoint] = field(default_factory=list)
    traces: int = 0
    settled: bool = True                  # b fits and b + resolution(b) does not (traced); False: budget ran out

    def to_dict(self) -> dict:
        return {
            "limit_bytes": self.limit_bytes, "margin_pct": self.margin_pct, "max_batch_size": self.max_batch_size,
            "fits": self.fits, "fixed_bytes": int(self.fit.fixed_bytes),
            "per_sample_bytes": int(self.fit.per_sample_bytes), "check_batch_size": self.check_batch_size,
            "check_error_pct": self.check_error_pct, "traces": self.traces, "settled": self.settled,
            "points": [p.__dict__ for p in sorted(self.points, key=lambda p: p.batch_size)],
        }


def find_capacity(point: Callable[[int], CurvePoint], batch_size: int, memory_bytes: int,
                  margin_pct: float = DEFAULT_MARGIN_PCT, first: CurvePoint | None = None,
                  max_traces: int = 16) -> Capacity:
    """Fit memory vs batch size and find the largest batch whose `device_used_bytes` stays under
    `memory_bytes * (1 - margin_pct/100)`. `point(b)` traces batch b; `first` is the asked batch, if
    already traced."""
    limit = int(memory_bytes * (1 - margin_pct / 100))
    cache: dict[int, CurvePoint] = {}
    if first is not None:
        cache[first.batch_size] = first

    def get(b: int) -> CurvePoint:
        if b not in cache:
            cache[b] = point(b)
        return cache[b]

    p1 = get(batch_size)
    p2 = get(max(batch_size * 4, 8))  # far enough apart that the per-sample part shows through the rounding
    fit = fit_line((p1.batch_size, p1.device_used_bytes), (p2.batch_size, p2.device_used_bytes))
    guess = max(1, fit.largest_within(limit))

    def fits(b: int) -> bool:
        return get(b).device_used_bytes <= limit

    known_fit, first_fail = 0, None
    for p in (p1, p2):
        if p.device_used_bytes <= limit:
            known_fit = max(known_fit, p.batch_size)
        elif first_fail is None or p.batch_size < first_fail:
            first_fail = p.batch_size
    check_b: int | None = None
    settled = False
    order = [p1.batch_size, p2.batch_size]
    last_side, streak, last_move = None, 0, 1
    bracketed = 0
    for step in range(max_traces):
        if first_fail is not None and first_fail - known_fit <= resolution(known_fit):
            settled = True
            break
        if step == 0:
            hint = guess
        elif first_fail is not None and bracketed % 2 == 1:
            hint = None  # every other step once bracketed is a bisection: the bracket at least halves
        else:
            hint = _hint(cache, order, known_fit, first_fail, limit, last_side, streak, last_move)
        bracketed += first_fail is not None
        b = next_candidate(known_fit, first_fail, hint)
        if b is None:
            settled = True
            break
        if b not in (p1.batch_size, p2.batch_size) and check_b is None:
            check_b = b
        order.append(b)
        side = "fit" if fits(b) else "fail"
        if side == "fit":
            last_move, known_fit = max(1, b - known_fit), b
        else:
            last_move = max(1, first_fail - b) if first_fail is not None else max(1, b - known_fit)
            first_fail = b if first_fail is None else min(first_fail, b)
        streak = streak + 1 if side == last_side else 1
        last_side = side
    else:
        settled = first_fail is not None and first_fail - known_fit <= resolution(known_fit)
    if known_fit >= MAX_BATCH:
        settled = True
    check_err = None
    if check_b is not None:
        real = cache[check_b].device_used_bytes
        check_err = round(100 * (fit.at(check_b) - real) / real, 3) if real else None
    return Capacity(limit, margin_pct, known_fit, p1.device_used_bytes <= limit, fit, check_b, check_err,
                    list(cache.values()), len(cache) - (first is not None), settled)


def _hint(cache: dict[int, CurvePoint], order: list[int], known_fit: int, first_fail: int | None, limit: int,
          last_side: str | None, streak: int, last_move: int) -> int | None:
    """Next batch to trace: where the line through the last two traced points crosses the limit (the
    secant method), kept inside the bracket. Memory is a staircase of 2 MiB segments and may curve, so a
    secant can creep by one sample at a time; when the same side moved twice in a row its step at least
    doubles instead (then the bracket closes by bisection through `next_candidate`)."""
    a, b = order[-2], order[-1]
    ua, ub = cache[a].device_used_bytes, cache[b].device_used_bytes
    if a != b and ua != ub:
        x = int(b + (limit - ub) * (b - a) / (ub - ua))
    elif first_fail is not None:
        x = (known_fit + first_fail) // 2
    else:
        return None
    if streak >= 2 and last_side == "fit":
        x = max(x, known_fit + 2 * last_move)
    elif streak >= 2 and last_side == "fail" and first_fail is not None:
        x = min(x, first_fail - 2 * last_move)
    upper = (first_fail - 1) if first_fail is not None else MAX_BATCH
    return min(max(x, known_fit + 1), upper)
