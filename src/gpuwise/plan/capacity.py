"""The largest batch that fits a GPU, settled by traces: b fits and b + 1 does not, both traced.

The phase lines of plan/curve.py only propose. Allocator rounding (512 B blocks, 2/20 MiB segments) and
kernels that choose their workspaces by size make memory a staircase, sometimes not even monotone, so
the search looks for the crossing among allocator replays of traces interpolated event by event
(plan/memory/synth.py: exact where every size is affine in the batch, ~2 % of a trace each), then traces the
crossing c and c + 1. Where replays miss twice it proposes the phase lines' crossing and its neighbour,
refits through the traces nearest the limit, and falls back to doubling / bisection when the model
creeps; it stops at `max_traces`. The loop is gpuwise/bracket.py's `search`, with these proposals as
its guess (asked afresh after every trace).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .. import bracket
from .curve import (
    DEFAULT_MARGIN_PCT,
    DEFAULT_MAX_TRACES,
    MAX_BATCH,
    SECOND_BATCH_MIN,
    CurvePoint,
    LinearFit,
    Piecewise,
    fit_line,
    fit_pieces,
    phase_peaks,
)


@dataclass
class Capacity:
    """The largest batch that fits on a GPU and how it was found."""

    limit_bytes: int                      # GPU memory minus the margin: what device_used must stay under
    margin_pct: float
    max_batch_size: int                   # 0: not even one sample fits
    fits: bool                            # the asked batch fits
    fit: LinearFit                        # the piece holding the peak at the answer, in device memory
    check_batch_size: int | None          # the first batch traced after the model's two
    check_error_pct: float | None         # model vs trace there (device memory)
    points: list[CurvePoint] = field(default_factory=list)
    traces: int = 0                       # traces run by the search (the asked batch's own not counted)
    settled: bool = True                  # b fits and b + 1 does not, both traced; False: budget ran out
    model: Piecewise | None = None        # the pieces through the traces that bracket the answer
    predicted_max_batch_size: int | None = None   # the first two traces' piecewise prediction
    line_max_batch_size: int | None = None        # ... and one line's (the former model), for comparison
    peak_phase: str = ""                  # where the peak sits at the answer (traced)
    max_traces: int = DEFAULT_MAX_TRACES
    capped: bool = False                  # MAX_BATCH fits: the search stopped at its ceiling
    replay_predicted_max_batch_size: int | None = None  # the first crossing found among replays (plan/memory/synth.py)
    replays: int = 0                      # allocator replays of interpolated traces (each ~2 % of a trace)

    @property
    def prediction_error_pct(self) -> float | None:
        return _err_pct(self.predicted_max_batch_size, self.max_batch_size)

    @property
    def replay_prediction_error_pct(self) -> float | None:
        return _err_pct(self.replay_predicted_max_batch_size, self.max_batch_size)

    @property
    def line_error_pct(self) -> float | None:
        return _err_pct(self.line_max_batch_size, self.max_batch_size)

    def to_dict(self) -> dict:
        pieces = {} if self.model is None else {
            ph: {"fixed_bytes": int(f.fixed_bytes), "per_sample_bytes": int(f.per_sample_bytes)}
            for ph, f in self.model.pieces.items()}
        return {
            "limit_bytes": self.limit_bytes, "margin_pct": self.margin_pct, "max_batch_size": self.max_batch_size,
            "fits": self.fits, "fixed_bytes": int(self.fit.fixed_bytes),
            "per_sample_bytes": int(self.fit.per_sample_bytes), "check_batch_size": self.check_batch_size,
            "check_error_pct": self.check_error_pct, "traces": self.traces, "settled": self.settled,
            "points": [dict(p.__dict__) for p in sorted(self.points, key=lambda p: p.batch_size)],
            "traced_order": [p.batch_size for p in self.points],
            "max_traces": self.max_traces, "capped": self.capped, "peak_phase": self.peak_phase,
            "pieces": pieces, "allocator_ratio": None if self.model is None else round(self.model.ratio_at(self.max_batch_size), 4),
            "predicted_max_batch_size": self.predicted_max_batch_size,
            "prediction_error_pct": self.prediction_error_pct,
            "line_max_batch_size": self.line_max_batch_size, "line_error_pct": self.line_error_pct,
            "replay_predicted_max_batch_size": self.replay_predicted_max_batch_size,
            "replay_prediction_error_pct": self.replay_prediction_error_pct, "replays": self.replays,
        }


def _err_pct(predicted: int | None, settled: int) -> float | None:
    if predicted is None or not settled:
        return None
    return round(100 * (predicted - settled) / settled, 2)


Replayed = Callable[[int, int, int], "CurvePoint | None"]  # (b, a, c): batch b from the traces of a and c


def find_capacity(point: Callable[[int], CurvePoint], batch_size: int, memory_bytes: int,
                  margin_pct: float = DEFAULT_MARGIN_PCT, first: CurvePoint | None = None,
                  max_traces: int = DEFAULT_MAX_TRACES, replayed: Replayed | None = None) -> Capacity:
    """The largest batch b whose traced `device_used_bytes` stays under `memory_bytes * (1 - margin_pct/100)`
    with b + 1 traced over it. `point(b)` traces batch b; `first` is the asked batch, if already traced.
    `replayed(b, a, c)`, if given, is batch b's point from the traces of a and c without tracing
    (plan/memory/synth.py: each event's size interpolated, then the allocator replayed; None when the two traces
    differ in structure): the search then looks for the crossing among replays and traces only what
    settles it, until replays have missed twice. At most `max_traces` traces beyond the asked batch's own;
    when they run out, `settled` is False and the answer is the largest batch seen to fit (a lower bound)."""
    limit = int(memory_bytes * (1 - margin_pct / 100))
    s = _Search(point, limit)
    if first is not None:
        s.cache[first.batch_size] = first
    p0 = s.get(batch_size, count=first is None)
    b1 = max(4 * batch_size, SECOND_BATCH_MIN) if s.fits(batch_size) else max(1, batch_size // 4)
    predicted = line = None
    if b1 != batch_size and not s.done():
        p1 = s.get(b1)
        predicted = s.model().largest_within(limit)
        line = fit_line((p0.batch_size, p0.device_used_bytes), (b1, p1.device_used_bytes)).largest_within(limit)
    check: list = []            # [the first batch traced by the search below, the model before it]
    state = {"misses": 0, "pending": None, "expect": None, "replay_predicted": None}

    def propose(ok: int | None, fail: int | None) -> int | None:
        """The next batch to trace: the c + 1 the replays named after c held, else the replays' crossing
        (until they have missed twice), else the phase lines' proposal (`_Search.propose`)."""
        b = expect = None
        pending = state["pending"]
        if pending is not None and pending[0] not in s.cache and s.known_fit < pending[0] < (s.first_fail or MAX_BATCH + 1):
            b, expect = pending   # the replays' crossing held at c: trace the c + 1 they named
        elif replayed is not None and state["misses"] < 2:
            found = s.replayed_crossing(replayed)
            if found is not None:
                c, fits_c, fits_c1 = found
                if state["replay_predicted"] is None:
                    state["replay_predicted"] = c
                b, expect = (c, fits_c) if c not in s.cache else (c + 1, fits_c1)
                state["pending"] = (c + 1, fits_c1)
        state["expect"] = expect
        return b if b is not None else s.propose()

    def trial(b: int) -> bool:
        if not check and b not in s.cache:
            check.extend((b, s.model()))
        s.get(b)
        if state["expect"] is not None and s.fits(b) != state["expect"]:
            state["misses"] += 1   # the sizes are not affine in b here (a kernel's workspace, a data-dependent shape)
            state["pending"] = None
        return s.fits(b)

    if not s.done():
        bracket.search(trial, 1, limit=MAX_BATCH, guess=propose, largest_ok=s.known_fit or None,
                       smallest_fail=s.first_fail, out_of_time=lambda: s.traces >= max_traces)
    check_b, check_model = check if check else (None, None)
    replay_predicted = state["replay_predicted"]
    model = s.model()
    answer = s.known_fit
    check_err = None
    if check_b is not None and check_model is not None and s.cache[check_b].device_used_bytes:
        real = s.cache[check_b].device_used_bytes
        check_err = round(100 * (check_model.device_used_at(check_b) - real) / real, 3)
    fit = model.device_line(answer or 1) if model is not None else LinearFit(float(p0.device_used_bytes), 0.0)
    peak_phase = ""
    if answer in s.cache:
        peaks = phase_peaks(s.cache[answer])
        peak_phase = max(peaks, key=peaks.get)
    return Capacity(limit, margin_pct, answer, s.fits(batch_size), fit, check_b, check_err,
                    list(s.cache.values()), s.traces, s.done(), model, predicted, line, peak_phase, max_traces,
                    answer >= MAX_BATCH, replay_predicted, s.replays)


def next_candidate(last_fit: int, first_fail: int | None, guess: int | None = None) -> int | None:
    """The next batch size to trace, from the largest known to fit (0: none) and the smallest known not to
    fit (None: none failed yet): gpuwise/bracket.py's search from 1, up to MAX_BATCH, trying `guess` first
    when it lies inside the bracket. None when the answer is settled (last_fit + 1 == first_fail)."""
    return bracket.next_candidate(last_fit or None, first_fail, 1, limit=MAX_BATCH, guess=guess)


def _crossing(fits: Callable[[int], bool], lo: int, hi: int | None, guess: int) -> int:
    """The largest b in [lo, hi) with fits(b) and not fits(b + 1) (or hi == b + 1), searched from
    `guess`: `bracket.search`'s seed mode with step 1 (steps of 1, 2, 4 ... away from it until the answer
    is bracketed, then bisection). `lo` is taken to fit (0: nothing) and `hi` not to (None: MAX_BATCH + 1)."""
    top = MAX_BATCH + 1 if hi is None else hi
    g = min(max(guess, lo + 1), top - 1)
    if g <= lo:
        return lo
    found = bracket.search(lambda b: b <= lo or fits(b), g, step=1, limit=top - 1)
    return found.largest_ok if found.largest_ok is not None else lo


class _Search:
    """The traced points, the bracket they make, and the next batch to trace."""

    def __init__(self, point: Callable[[int], CurvePoint], limit: int):
        self.point, self.limit = point, limit
        self.cache: dict[int, CurvePoint] = {}
        self.traces = 0
        self.known_fit = 0                    # largest batch traced that fits (0: none)
        self.first_fail: int | None = None    # smallest batch traced above known_fit that does not fit
        self.widths: list[int] = []           # bracket width after each trace once bracketed
        self.low_streak = 0                   # proposals in a row where the model said known_fit is the answer
        self.replays = 0
        self.replay_cache: dict[tuple[int, int, int], CurvePoint | None] = {}

    def fits(self, b: int) -> bool:
        return self.cache[b].device_used_bytes <= self.limit

    def get(self, b: int, count: bool = True) -> CurvePoint:
        if b not in self.cache:
            self.cache[b] = self.point(b)
            self.traces += count
        if self.fits(b):
            self.known_fit = max(self.known_fit, b)
            if self.first_fail is not None and self.first_fail <= self.known_fit:
                # memory is not monotone here (allocator layout): keep the bracket above the larger fit
                fails = [x for x in self.cache if x > self.known_fit and not self.fits(x)]
                self.first_fail = min(fails) if fails else None
        elif b > self.known_fit and (self.first_fail is None or b < self.first_fail):
            self.first_fail = b
        if self.first_fail is not None:
            self.widths.append(self.first_fail - self.known_fit)
        return self.cache[b]

    def done(self) -> bool:
        if self.known_fit >= MAX_BATCH:
            return True
        return self.first_fail is not None and self.first_fail - self.known_fit <= 1

    def model(self) -> Piecewise | None:
        """The pieces anchored at the trace nearest the limit (device memory closest to it, either side),
        with slopes from the nearest other trace at least max(8, b/16) samples away, so that allocator
        steps of a few MiB do not dominate them (none that far: the farthest); the allocator's ratio is
        the anchor's."""
        if len(self.cache) < 2:
            return None
        a = min(self.cache, key=lambda x: (abs(self.cache[x].device_used_bytes - self.limit), -x))
        others = [x for x in self.cache if x != a]
        far = [x for x in others if abs(x - a) >= max(8, a // 16)]
        b = min(far, key=lambda x: abs(x - a)) if far else max(others, key=lambda x: abs(x - a))
        return fit_pieces(self.cache[a], self.cache[b], (self.cache[a],))

    def propose(self) -> int | None:
        """The model's largest batch when it is untraced, else the neighbour that settles it; kept inside
        the bracket, doubling its step when the model keeps saying the known fit is the answer and the
        neighbour fits, bisecting when it promises a batch known not to fit or the bracket did not halve
        in two traces."""
        lo, hi = self.known_fit, self.first_fail
        model = self.model()
        if model is None:
            return next_candidate(lo, hi)
        guess = model.largest_within(self.limit)
        if guess <= lo:             # the model says lo is the answer: trace its neighbour to settle it
            guess = lo + (1 << min(self.low_streak, 20))
            self.low_streak += 1
        else:
            self.low_streak = 0
        if hi is not None and hi - lo > 2:
            w = self.widths
            if guess >= hi or (len(w) >= 3 and w[-1] > w[-3] // 2):
                # the model promises a batch known not to fit (its lines miss an allocator step), or it
                # creeps inside the bracket: bisect
                guess = (lo + hi) // 2
        if hi is not None:
            guess = min(guess, hi - 1)
        guess = max(1, min(guess, MAX_BATCH))
        return guess if guess not in self.cache else next_candidate(lo, hi)

    def replayed_crossing(self, replayed: Replayed) -> tuple[int, bool, bool] | None:
        """The crossing inside the traced bracket among replays (traced batches count as traced), from the
        pair of traces nearest the limit: the bracket's ends when there are both, else the trace nearest
        the limit and its nearest other. (c, whether c fits, whether c + 1 fits); None when no pair has
        the same structure."""
        a = min(self.cache, key=lambda x: (abs(self.cache[x].device_used_bytes - self.limit), -x))
        pairs = [(self.known_fit, self.first_fail)] if self.known_fit and self.first_fail is not None else []
        pairs += [(a, x) for x in sorted(self.cache, key=lambda x: abs(x - a)) if x != a]
        model = self.model()
        guess = model.largest_within(self.limit) if model is not None else self.known_fit + 1
        probe = min(max(guess, self.known_fit + 1), MAX_BATCH)
        for pa, pc in pairs[:3]:
            if probe not in self.cache and self._replay(probe, pa, pc, replayed) is None:
                continue  # the two traces differ in structure

            def fits(b: int, pa: int = pa, pc: int = pc) -> bool:
                if b in self.cache:
                    return self.fits(b)
                p = self._replay(b, pa, pc, replayed)
                return p is not None and p.device_used_bytes <= self.limit

            c = _crossing(fits, self.known_fit, self.first_fail, guess)
            return c, fits(c), fits(c + 1)
        return None

    def _replay(self, b: int, a: int, c: int, replayed: Replayed) -> CurvePoint | None:
        key = (b, min(a, c), max(a, c))
        if key not in self.replay_cache:
            self.replay_cache[key] = replayed(b, a, c)
            self.replays += 1
        return self.replay_cache[key]
