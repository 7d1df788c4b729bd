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


class StageProgress:
    """Callable for `estimate(on_progress=...)`: once `after_s` have passed, prints the running stage on
    stderr (`estimate: tracing 3 of 80 blocks at batch 1 (2.1 s)`) as it changes, and every `every_s`
    while one stage lasts. Quick runs print nothing. Use as a context manager (a timer thread)."""

    def __init__(self, prefix: str, after_s: float = 2.0, every_s: float = 5.0, clock=time.monotonic):
        import threading

        self.prefix, self.after_s, self.every_s, self.clock = prefix, after_s, every_s, clock
        self.stage: str | None = None  # nothing is said before the first stage (a bad input fails before it)
        self.lines = 0
        self._start = clock()
        self._printed: tuple[str, float] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __call__(self, stage: str) -> None:
        self.stage = stage
        self.tick()

    def tick(self) -> None:
        now = self.clock()
        elapsed = now - self._start
        if elapsed < self.after_s or self.stage is None:
            return
        if self._printed is not None and self._printed[0] == self.stage and now - self._printed[1] < self.every_s:
            return
        self._printed = (self.stage, now)
        self.lines += 1
        console.err.print(f"{self.prefix}: {self.stage} ({_secs(elapsed)})", markup=False, highlight=False,
                          soft_wrap=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.tick()

    def __enter__(self) -> StageProgress:
        self._start = self.clock()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
