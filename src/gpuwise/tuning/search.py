"""The tuner's search strategies as small functions over a `measure` callback, testable without a device.

Batch size: the fit trials are `bracket.search` (the one largest-batch loop, shared with
`gpuwise measure --max-batch` and the planner); the tuner adds the speed rule on top. Worker count: a hill climb
from an estimate (compute rate / one worker's rate) that stops when the next step is slower.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import bracket

MIN_GAIN = 0.05  # stop growing the batch when doubling gains less than 5% samples/s (issue 5)
# differences below this fraction are noise: repeated trials on a shared CPU differ by 5-30% (measured
# on this project's 2-core CI machines, benchmarks/results/tune_imagefolder-cpu.json)
NOISE = 0.05


@dataclass
class Probe:
    """One batch-size trial as the search sees it."""

    batch_size: int
    timed: bool                  # a speed trial (True) or a short fit trial (False)
    status: str                  # 'ok', 'oom', or another status (error, timeout: the search stops)
    samples_per_s: float | None = None


@dataclass
class BatchSearch:
    best_batch_size: int | None           # throughput-optimal: the last doubling that still paid >= MIN_GAIN
    largest_safe_batch_size: int | None   # the largest batch that ran (None: not searched / none ran)
    probes: list[Probe] = field(default_factory=list)
    stop_reason: str = ""
    largest_safe_searched: bool = False   # True when an OOM bounded the search (or the seed was confirmed)

    @property
    def sequence(self) -> list[int]:
        return [p.batch_size for p in self.probes]


Measure = Callable[[int, bool], Probe]


def search_batch(measure: Measure, start: int, *, oom_possible: bool, seed: int | None = None,
                 limit: int | None = None, min_gain: float = MIN_GAIN,
                 out_of_time: Callable[[], bool] = lambda: False) -> BatchSearch:
    """Throughput-optimal and largest safe batch with few trials.

    1. With a planner `seed` (and OOM possible): confirm the largest safe batch first with fit trials
       (seed, seed +/- seed//16 doubling, bisection: `bracket.search`'s seed mode).
    2. Speed: start, 2*start, ... (capped at the largest safe batch and `limit`); stop when a doubling
       gains less than `min_gain`, or at the first OOM.
    3. Without a seed, when OOM is possible: continue with fit trials (doubling from the largest that
       ran, then bisection) until the largest safe batch is pinned to 1.
    """
    probes: list[Probe] = []
    ok: int | None = None
    fail: int | None = None

    def run(batch: int, timed: bool) -> Probe:
        nonlocal ok, fail
        p = measure(batch, timed)
        probes.append(p)
        if p.status == "ok":
            ok = batch if ok is None else max(ok, batch)
        elif p.status == "oom":
            fail = batch if fail is None else min(fail, batch)
        return p

    def fit_trial(batch: int) -> bool | None:
        status = run(batch, False).status
        return True if status == "ok" else False if status == "oom" else None

    searched = False
    if oom_possible and seed:
        found = bracket.search(fit_trial, seed, step=max(1, seed // 16), limit=limit, out_of_time=out_of_time)
        if found.stopped == "error":
            return BatchSearch(None, ok, probes, f"batch {found.tried[-1]}: {probes[-1].status}")
        searched = True
    cap = ok if searched else limit
    best, best_rate, reason = None, None, ""
    b = min(start, cap) if cap else start
    while b is not None:
        if out_of_time():
            reason = "budget"
            break
        if fail is not None and b >= fail:
            reason = f"batch {b} would not fit"
            break
        p = run(b, True)
        if p.status == "oom":
            reason = f"out of memory at batch {b}"
            break
        if p.status != "ok":
            return BatchSearch(best, ok, probes, f"batch {b}: {p.status}", searched)
        rate = p.samples_per_s or 0.0
        if best_rate is not None and rate < best_rate * (1 + min_gain):
            reason = f"batch {b} gained {rate / best_rate - 1:+.0%} samples/s (< {min_gain:.0%})"
            break
        best, best_rate = b, rate
        nxt = b * 2
        if cap is not None and nxt > cap:
            nxt = cap if b < cap else None
            if nxt is None:
                reason = f"reached the {'largest safe batch' if searched else 'limit'} {b}"
        b = nxt
    if oom_possible and not searched and not out_of_time():
        bracket.search(fit_trial, start, limit=limit, largest_ok=ok, smallest_fail=fail, out_of_time=out_of_time)
        searched = fail is not None or (limit is not None and ok == limit)
    if best is None and ok is not None and not out_of_time():  # the start itself did not fit
        p = run(ok, True)
        if p.status == "ok":
            best = ok
    return BatchSearch(best, ok, probes, reason, searched)


def next_workers(rates: dict[int, float], estimate: int, max_workers: int, tolerance: float = 0.0) -> int | None:
    """The next num_workers to try in a hill climb from `estimate`, or None when the best's neighbours
    are both measured (and slower). `rates` maps num_workers -> end-to-end samples/s measured so far.
    With `tolerance`, a count within that fraction of the best is a plateau, not a slowdown: the climb
    goes on upwards from it (a noisy machine must not stop the climb one step early)."""
    estimate = min(max(estimate, 0), max_workers)
    if not rates:
        return estimate
    best = max(rates, key=lambda w: rates[w])
    top = max(rates)
    start = top if rates[top] >= (1 - tolerance) * rates[best] else best
    for cand in (_up(start, max_workers), _down(best)):
        if cand is not None and cand not in rates:
            return cand
    return None


def _up(w: int, max_workers: int) -> int | None:
    nxt = w + 1 if w < 4 else int(math.ceil(w * 1.5))
    return min(nxt, max_workers) if w < max_workers else None


def _down(w: int) -> int | None:
    if w <= 0:
        return None
    return w - 1 if w <= 4 else int(w / 1.5)


def workers_estimate(compute_rate: float, one_worker_rate: float, cpus: int) -> int:
    """Workers needed to feed the device: ceil(compute samples/s / one worker's samples/s), within the CPUs."""
    if one_worker_rate <= 0:
        return max(1, cpus)
    return max(1, min(cpus, math.ceil(compute_rate / one_worker_rate)))
