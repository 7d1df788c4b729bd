"""The one seam to `torch.profiler` for CPU memory profiles.

torch 2.13's kineto prints `USDT: ... profiler_start/stop` lines straight to file descriptor 2 on every
profile, which no environment variable turns off; they would litter every command's stderr. The
descriptor is pointed at /dev/null only while the profiler starts and stops — not while the profiled
code runs, so the workload's own messages still show.
"""

from __future__ import annotations

import contextlib
import os
import sys


@contextlib.contextmanager
def _quiet_fd2():
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def cpu_memory_profile(**kwargs):
    """`torch.profiler.profile(activities=[CPU], profile_memory=True, **kwargs)`, without kineto's banner."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, **kwargs)
    with _quiet_fd2():
        prof.__enter__()
    try:
        yield prof
    finally:
        with _quiet_fd2():
            prof.__exit__(None, None, None)
