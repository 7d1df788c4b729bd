"""The true max batch on a real device: isolated trials, a pure search strategy, and the driver.

The strategy is one pure function, `next_candidate(largest_ok, smallest_fail, start, ...)` (gpuwise/bracket.py), driven by
one loop, `bracket.search`, so that every search (this one, the tuner's, the planner's) is the same loop and tests can
assert the exact sequence of batch sizes tried (after Lightning's `tuner/batch_size_scaling.py`, without its duplicated
power/binsearch loops):

* no seed (`step=None`): start, 2*start, 4*start, ... until one fails; halve while the start fails;
  then bisect between the largest that ran and the smallest that failed;
* a seed (the planner's prediction) with a `step`: seed, seed+step, seed+2*step, seed+4*step, ...
  (or seed-step, seed-2*step, ... when the seed fails), then bisect. A good seed is confirmed with
  about log2(step) + 2 trials instead of log2(max) * 2.

Each trial runs in a spawned child (`measure.child.run_isolated`), so an OOM never poisons the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .. import bracket
from ..bracket import next_candidate  # noqa: F401  (re-exported by gpuwise.measuring)
from ..errors import GpuwiseError
from .child import run_isolated

OK, OOM = "ok", "oom"


class Trial(NamedTuple):
    """One isolated trial: (batch_size, status, seconds); status is 'ok', 'oom' or an error status."""

    batch_size: int
    status: str
    seconds: float


@dataclass
class MaxBatchResult:
    max_batch_size: int | None      # largest batch that ran; None when even the smallest tried failed
    trials: list[Trial]
    capped: bool = False            # the search stopped at `limit` without a failure
    error: str = ""                 # set when a trial failed for a reason other than OOM (search stopped)
    values: dict[int, dict[str, Any]] = field(default_factory=dict)  # batch -> the trial's measurement

    @property
    def batch_sizes_tried(self) -> list[int]:
        return [t.batch_size for t in self.trials]

    def to_dict(self) -> dict[str, Any]:
        return {"max_batch_size": self.max_batch_size, "capped": self.capped, "error": self.error or None,
                "trials": [{"batch_size": t.batch_size, "status": t.status, "seconds": round(t.seconds, 3)}
                           for t in self.trials]}


class TrialOutcome(NamedTuple):
    """What a trial function returns: status ('ok' | 'oom' | other = error), seconds, message, values."""

    status: str
    seconds: float = 0.0
    error: str = ""
    value: dict | None = None


def search(trial: Callable[[int], TrialOutcome], start: int, *, step: int | None = None,
           limit: int | None = None, resolution: int = 1, max_trials: int = 64,
           on_trial: Callable[[Trial], None] | None = None) -> MaxBatchResult:
    """`bracket.search` with `trial(batch_size) -> TrialOutcome` until the search ends.

    A status other than ok/oom (a crash, a timeout, a bug in the workload) stops the search: it says
    nothing about memory, so guessing past it would report a wrong maximum.
    """
    trials: list[Trial] = []
    values: dict[int, dict] = {}
    errors: list[str] = []

    def ran(batch: int) -> bool | None:
        outcome = trial(batch)
        record = Trial(batch, outcome.status, float(outcome.seconds))
        trials.append(record)
        if on_trial is not None:
            on_trial(record)
        if outcome.status == OK:
            values[batch] = dict(outcome.value or {})
            return True
        if outcome.status == OOM:
            return False
        errors.append(f"batch {batch}: {outcome.status}: {outcome.error}".rstrip(": "))
        return None

    found = bracket.search(ran, start, step=step, limit=limit, resolution=resolution, max_trials=max_trials)
    largest_ok = found.largest_ok
    capped = found.smallest_fail is None and largest_ok is not None and limit is not None and largest_ok >= limit
    return MaxBatchResult(largest_ok, trials, capped=capped, error=errors[0] if errors else "", values=values)


def isolated_trial(workload: str, *, optimizer: str | None = None, precision: str = "fp32",
                   checkpointing: bool = False, device: str = "cuda", steps: int = 1, warmup: int = 1,
                   timeout_s: float | None = 600, env: dict[str, str] | None = None) -> Callable[[int], TrialOutcome]:
    """A trial function: warm-up + `steps` steady steps of `workload` at a batch size, in a spawned child."""
    def trial(batch_size: int) -> TrialOutcome:
        kwargs = {"workload": workload, "batch_size": batch_size, "optimizer": optimizer, "precision": precision,
                  "checkpointing": checkpointing, "device": device, "steps": steps, "warmup": warmup,
                  "cpu_peak": False}
        res = run_isolated("gpuwise.measuring.runner:run_measurement", kwargs, timeout_s=timeout_s, env=env)
        status = res.status
        if status == OK and res.value.get("oom"):
            status = OOM
        return TrialOutcome(status, res.seconds, res.error, res.value)

    return trial


def find_max_batch(workload, *, optimizer: str | None = None, precision: str = "fp32", checkpointing: bool = False,
                   device: str = "cuda", start: int | None = None, seed: int | None = None, step: int | None = None,
                   limit: int | None = None, resolution: int = 1, timeout_s: float | None = 600,
                   trial: Callable[[int], TrialOutcome] | None = None,
                   on_trial: Callable[[Trial], None] | None = None) -> MaxBatchResult:
    """The largest batch of `workload` that runs a steady-state training step on `device`.

    Without a seed: power-of-two growth from `start` (default 1), then bisection. With `seed` (e.g. the
    planner's max batch): try it, then seed +/- step (default seed // 16, at least 1), doubling, then
    bisection. `trial` replaces the isolated child trial (tests, or the tuner's own trial).
    """
    spec = workload if isinstance(workload, str) else getattr(workload, "spec", None)
    if not isinstance(spec, str):
        raise GpuwiseError("find_max_batch needs a workload spec string (path.py, pkg.mod or examples:NAME)")
    if start is not None and start < 1:
        raise GpuwiseError(f"the starting batch size must be positive, got {start}")
    if seed is not None:
        if seed < 1:
            raise GpuwiseError(f"seed must be a positive batch size, got {seed}")
        first, step = seed, step or max(1, seed // 16)
    else:
        first = start or 1
    if trial is None:
        trial = isolated_trial(spec, optimizer=optimizer, precision=precision, checkpointing=checkpointing,
                               device=device, timeout_s=timeout_s)
    return search(trial, first, step=step, limit=limit, resolution=resolution, on_trial=on_trial)
