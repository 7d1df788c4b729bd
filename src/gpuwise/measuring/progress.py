"""Step progress of a long measurement, reported from the process that runs the steps.

The measuring code calls `step_done(done, total, warmup, step_s)` after every step (warm-up included);
whoever started it installs a reporter with `set_reporter(fn)`: the measure child sends the
`StepProgress` to its parent through the child-process pipe (`measuring/child.py`), a scale rank writes
it to a small JSON file the parent polls (`scaleout/scale.py`). Nothing is printed here: the command
formats it (`report/progress.py`). Without a reporter `step_done` costs one function call.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass


@dataclass
class StepProgress:
    done: int                 # steps finished, warm-up included
    total: int                # warm-up + timed steps
    warmup: int               # how many of `total` are warm-up
    step_s: float             # the last step's wall time
    label: str = ""           # e.g. "2 ranks" for scale

    @property
    def left_s(self) -> float:
        return max(self.total - self.done, 0) * self.step_s

    def to_dict(self) -> dict:
        return asdict(self)


_reporter: Callable[[StepProgress], None] | None = None


def set_reporter(fn: Callable[[StepProgress], None] | None) -> None:
    global _reporter
    _reporter = fn


def step_done(done: int, total: int, warmup: int, step_s: float, label: str = "") -> None:
    if _reporter is not None:
        try:
            _reporter(StepProgress(done, total, warmup, step_s, label))
        except Exception:  # noqa: BLE001 - progress is a courtesy; it never breaks a measurement
            pass


def file_reporter(path: str, min_interval_s: float = 0.5) -> Callable[[StepProgress], None]:
    """A reporter that replaces `path` with the latest progress (atomic rename: readers see whole files);
    the first and last step always, others at most every `min_interval_s` (keeps the cost off fast steps)."""
    last = [float("-inf")]

    def write(p: StepProgress) -> None:
        now = time.monotonic()
        if p.done not in (1, p.total) and now - last[0] < min_interval_s:
            return
        last[0] = now
        tmp = f"{path}.tmp"
        with open(tmp, "w") as fh:
            json.dump(p.to_dict(), fh)
        os.replace(tmp, path)
    return write


def read_file(path: str) -> StepProgress | None:
    try:
        with open(path) as fh:
            return StepProgress(**json.load(fh))
    except (OSError, ValueError, TypeError):
        return None
