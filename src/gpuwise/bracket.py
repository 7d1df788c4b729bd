"""The next batch size to try between the largest that ran (or fit) and the smallest that did not.

One pure strategy for every batch search: the max-batch search on a device (measuring/maxbatch.py), the
tuner's batch search (tuning/search.py) and the planner's capacity search over traces (plan/capacity.py).
Its docstring gives the sequence; the callers' tests assert the exact batch sizes tried. `search` is the
one loop that drives it: every largest-batch search is `search(trial, ...)` with its own trial.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple


def next_candidate(largest_ok: int | None, smallest_fail: int | None, start: int, *,
                   step: int | None = None, limit: int | None = None, resolution: int = 1,
                   guess: int | None = None) -> int | None:
    """The next batch size to try, or None when the search is over.

    `largest_ok` / `smallest_fail`: the largest batch that ran and the smallest that ran out of memory
    so far (None: none yet). `start`: the first candidate (the seed). `step`: None for power-of-two
    growth from `start`; an int for seed mode (grow or shrink by step, 2*step, 4*step ... from start).
    `limit`: never try above it. `resolution`: stop when smallest_fail - largest_ok <= resolution.
    `guess`: a prediction (plan/capacity.py: replays or phase lines) tried first when inside the open bracket.
    """
    if start < 1:
        raise ValueError(f"start must be >= 1, got {start}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if step is not None and step < 1:
        raise ValueError(f"step must be >= 1, got {step}")
    if largest_ok is not None and smallest_fail is not None and smallest_fail - largest_ok <= max(resolution, 1):
        return None
    if guess is not None and (largest_ok or 0) < guess and (smallest_fail is None or guess < smallest_fail):
        return guess
    if largest_ok is None and smallest_fail is None:
        return min(start, limit) if limit is not None else start
    if smallest_fail is None:  # only successes: grow
        if limit is not None and largest_ok >= limit:
            return None
        if step is None:
            nxt = largest_ok * 2
        else:
            nxt = largest_ok + max(step, largest_ok - start)
        return min(nxt, limit) if limit is not None else nxt
    if largest_ok is None:  # only failures: shrink
        if smallest_fail <= 1:
            return None
        if step is None:
            return smallest_fail // 2
        return max(1, smallest_fail - max(step, start - smallest_fail))
    return (largest_ok + smallest_fail) // 2


class Searched(NamedTuple):
    """What `search` settled: the largest batch that ran (fit) and the smallest that did not (None: none
    so far), the batch sizes tried in order, and why it stopped: "" (settled, or the limit reached),
    "trials" (max_trials spent), "time" (out_of_time said so) or "error" (a trial said neither)."""

    largest_ok: int | None
    smallest_fail: int | None
    tried: list[int]
    stopped: str = ""


Guess = int | None | Callable[[int | None, int | None], int | None]


def search(trial: Callable[[int], bool | None], start: int, *, step: int | None = None,
           limit: int | None = None, resolution: int = 1, guess: Guess = None,
           largest_ok: int | None = None, smallest_fail: int | None = None, max_trials: int | None = None,
           out_of_time: Callable[[], bool] | None = None) -> Searched:
    """The one largest-batch search loop: ask `next_candidate` (same arguments) for a batch, run
    `trial(batch)` -> True (it ran / fits), False (out of memory / over the limit) or None (neither: an
    error, which says nothing about memory, so the search stops there), until the bracket is settled.
    `guess` may be a function of the bracket, `guess(largest_ok, smallest_fail)`, asked afresh each round
    while the bracket is open (a model that learns from every trial: plan/capacity.py).

    `largest_ok` / `smallest_fail` start the bracket where earlier trials left it. Every candidate lies
    inside the open bracket, so when memory is not monotone in the batch (allocator layout: 1553 fits,
    1554 does not, 1559 fits again) the answer is the crossing this search settles: a batch that fits
    whose neighbour above does not."""
    ok, fail = largest_ok, smallest_fail
    tried: list[int] = []
    while True:
        if max_trials is not None and len(tried) >= max_trials:
            return Searched(ok, fail, tried, "trials")
        if out_of_time is not None and out_of_time():
            return Searched(ok, fail, tried, "time")
        batch = next_candidate(ok, fail, start, step=step, limit=limit, resolution=resolution)
        if batch is None:
            return Searched(ok, fail, tried)
        if guess is not None:
            g = guess(ok, fail) if callable(guess) else guess
            batch = next_candidate(ok, fail, start, step=step, limit=limit, resolution=resolution, guess=g)
        tried.append(batch)
        result = trial(batch)
        if result is None:
            return Searched(ok, fail, tried, "error")
        if result:
            ok = batch if ok is None else max(ok, batch)
        else:
            fail = batch if fail is None else min(fail, batch)
