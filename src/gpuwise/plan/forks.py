"""Traces side by side: how many CPUs a round of forks may use (`idle_cpus`), and how a round's steps are
split into tasks for them (`fork_tasks`). plan/scaled.py's `Evaluator.prefetch` runs the rounds; plan/fit.py
asks how many CPUs to fill.
"""

from __future__ import annotations

from typing import Any

from .tracing.repeat import CHECKED, TRACED


def fork_tasks(keys: list, pairs: set, cpus: int) -> list[tuple[Any, int | None]]:
    """`Evaluator.prefetch`'s tasks for `cpus` forks: (key, None) traces a step (rebuilt in the fork from its 3- and
    4-block traces where it is one of `pairs`), (key, blocks) one of those two small traces. A step is one
    task (its second trace reuses what the fork's first set up: splitting every step made a 7B fit on 2
    CPUs 0.4 s slower, 9.3 vs 8.9 s in-process), but where the tasks would leave a
    CPU idle at the end, the last steps of `pairs` are two tasks each, the longer trace first."""
    tasks: list[tuple[Any, int | None]] = [(key, None) for key in keys]
    for key in [k for k in keys if k in pairs][::-1][:len(keys) % cpus if cpus > 1 else 0]:
        tasks.remove((key, None))
        tasks += [(key, CHECKED), (key, TRACED)]
    return tasks


def idle_cpus() -> int:
    """CPUs this process may use that the last minute's load leaves free (itself counted): forks side by
    side only help where they do not queue behind other work; 1 on a busy or one-CPU machine. The load this
    process and its forks put there themselves (`_own_load`) is not another's: counted, a `--gpu all` fit
    on an idle 2-CPU machine stopped forking after about 40 s of its own forks (load average over 1)."""
    import os

    usable = len(os.sched_getaffinity(0))
    others = os.getloadavg()[0] - _own_load()
    return max(1, min(usable, int(usable - others + 1)))


_OWN: list[float] = []  # [when, CPU seconds of this process and its reaped forks then, their load then]


def _own_load() -> float:
    """This process's and its finished forks' share of the 1-minute load average, estimated as the kernel
    averages the load (exponentially, over a minute) from their CPU seconds between calls; 0 at the first."""
    import math
    import os
    import time

    t = os.times()
    now, cpu = time.monotonic(), t.user + t.system + t.children_user + t.children_system
    if not _OWN:
        _OWN[:] = [now, cpu, 0.0]
        return 0.0
    then, cpu_then, load = _OWN
    if now > then:
        decay = math.exp(-(now - then) / 60)
        load = load * decay + (cpu - cpu_then) / (now - then) * (1 - decay)
    _OWN[:] = [now, cpu, load]
    return load
