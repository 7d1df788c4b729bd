"""Progress lines on stderr, at most about one a second: `measure: step 3/8 (warm-up 2), 4.1 s/step, ~20 s left`."""

from __future__ import annotations

import time

from ..measuring.progress import StepProgress
from . import console


def progress_line(prefix: str, p: StepProgress) -> str:
    label = f" {p.label}:" if p.label else ""
    return (f"{prefix}:{label} step {p.done}/{p.total} (warm-up {p.warmup}), "
            f"{_secs(p.step_s)}/step, ~{_secs(p.left_s)} left")


def _secs(s: float) -> str:
    if s < 1:
        return f"{s * 1e3:.0f} ms"
    return f"{s:.1f} s" if s < 60 else f"{int(s // 60)} m {int(s % 60):02d} s"


class ProgressPrinter:
    """Callable for `on_progress`: prints the first update, then at most one per `interval_s`, on stderr."""

    def __init__(self, prefix: str, interval_s: float = 1.0, clock=time.monotonic):
        self.prefix, self.interval_s, self.clock = prefix, interval_s, clock
        self.last_s: float | None = None
        self.lines = 0

    def __call__(self, p: StepProgress) -> None:
        now = self.clock()
        if self.last_s is not None and now - self.last_s < self.interval_s:
            return
        self.last_s = now
        self.lines += 1
        console.err.print(progress_line(self.prefix, p), markup=False, highlight=False, soft_wrap=True)
