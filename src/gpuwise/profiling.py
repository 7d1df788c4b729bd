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
def cpu_memory_profile(all_threads: bool = False, **kwargs):
    """`torch.profiler.profile(activities=[CPU], profile_memory=True, **kwargs)`, without kineto's banner.

    The profiler records the allocations and frees of the threads it profiles only: a tensor whose last
    reference drops on another thread (a gloo worker finishing a collective releases its output, FSDP2's
    all-gather buffer, after the main thread did) is never seen freed, and the running sum of `[memory]`
    sizes grows step after step (2 gloo ranks, FSDP2, small Llama: one gathered block a step on one rank,
    two on the other). `all_threads=True` also counts those frees: c10's CPU memory reporter, with
    `FLAGS_caffe2_report_cpu_memory_usage` set (libc10's exported flag), keeps its byte total over every
    thread's allocations and frees, and each recorded event carries that total (`total_allocated`), which
    `cpu_truth.peak_in_profile(totals=True)` reads. The flag is set only while profiling."""
    from torch.profiler import ProfilerActivity, profile

    flag = _report_cpu_memory_flag() if all_threads else None
    if all_threads and flag is None:
        raise RuntimeError("this torch build does not export FLAGS_caffe2_report_cpu_memory_usage: "
                           "frees on other threads cannot be counted")
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, **kwargs)
    if flag is not None:
        flag.value = True
    with _quiet_fd2():
        prof.__enter__()
    try:
        yield prof
    finally:
        with _quiet_fd2():
            prof.__exit__(None, None, None)
        if flag is not None:
            flag.value = False


def _report_cpu_memory_flag():
    """libc10's `FLAGS_caffe2_report_cpu_memory_usage` (a C bool, CPUAllocator.cpp), or None."""
    import ctypes

    import torch

    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
        return ctypes.c_bool.in_dll(lib, "FLAGS_caffe2_report_cpu_memory_usage")
    except (OSError, ValueError):
        return None
