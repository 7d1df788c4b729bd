"""What the bootstrap's hooks read per batch: a thread's CPU demand (/proc schedstat) and a batch's size.

Standard library only (nothing of gpuwise, no torch), like hooks.py, which loads this file by its path
as `_gpuwise_probes`.
"""

from __future__ import annotations

import operator
import os
import time

# Seconds between CPU-demand reads while the main process loads (num_workers=0): a read pair costs ~5 us
# (thread_demand_s under python -m timeit on the 2-core dev machine), so <= 0.05 % of the time between
# reads, and a data-starved loop (batches of milliseconds) still has a read every batch or two.
DEMAND_EVERY_S = 0.01


def demand_s(path: str) -> float | None:
    """Seconds a thread ran on a CPU plus waited in a run queue for one (Linux schedstat: "run_ns wait_ns
    slices", Documentation/scheduler/sched-stats.rst). A CPU-bound thread on a busy machine shares its
    core but stays runnable: run + wait ~= wall; a thread blocked on I/O sleeps, which counts in neither."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            run_ns, wait_ns = os.read(fd, 128).split()[:2]
        finally:
            os.close(fd)
        return (int(run_ns) + int(wait_ns)) / 1e9
    except (OSError, ValueError):
        return None


_SCHEDSTAT_FDS: dict[int, int | None] = {}  # native thread id -> an open /proc/self/task/TID/schedstat


def thread_demand_s() -> float:
    """This thread's CPU demand in seconds (schedstat), or its CPU time where there is no schedstat.
    The file stays open and is re-read with pread (~3 us; opening it each time costs ~20 us)."""
    import threading

    tid = threading.get_native_id()
    fd = _SCHEDSTAT_FDS.get(tid, -1)
    if fd == -1:
        try:
            fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
        except OSError:
            fd = None
        _SCHEDSTAT_FDS[tid] = fd
    if fd is not None:
        try:
            run_ns, wait_ns = os.pread(fd, 128, 0).split()[:2]
            return (int(run_ns) + int(wait_ns)) / 1e9
        except (OSError, ValueError):
            _SCHEDSTAT_FDS[tid] = None
    return time.thread_time()


def batch_len(batch) -> int:
    """Samples in a batch: the first dimension of its first tensor (tensor, list/tuple, dict, nested once)."""
    path = batch_path(batch)
    if path is None:
        return 0
    shape = first_tensor_getter(path)(batch).shape
    return int(shape[0]) if len(shape) else 1


_DATA = object()  # a path step into `.data` (transformers' BatchEncoding is a UserDict)


def batch_path(batch) -> tuple | None:
    """The keys / indices from a batch to its first tensor (what has a `shape`), or None when there is none."""
    path: list = []
    for _ in range(3):
        if getattr(batch, "shape", None) is not None:
            return tuple(path)
        if isinstance(batch, dict):
            if not batch:
                return None
            key = next(iter(batch))
            batch = batch[key]
        elif isinstance(batch, (list, tuple)):
            if not batch:
                return None
            key, batch = 0, batch[0]
        else:
            data = getattr(batch, "data", None)
            if not isinstance(data, dict):
                return None
            key, batch = _DATA, data
        path.append(key)
    return tuple(path) if getattr(batch, "shape", None) is not None else None


def _not_yet(batch):
    raise LookupError("no path to a tensor known yet")


def first_tensor_getter(path: tuple | None):
    """A callable from a batch to its first tensor along `path` (batch_path's): a C-level itemgetter for the
    usual one-step path (a tuple's [0], a dict's first key), so that the per-batch read stays cheap."""
    if path is None:
        return _not_yet
    if len(path) == 1 and path[0] is not _DATA:
        return operator.itemgetter(path[0])

    def walk(batch):
        for key in path:
            batch = batch.data if key is _DATA else batch[key]
        return batch

    return walk


class LoaderInfo:
    """One DataLoader's settings and what its batches cost (attributes, not a dict: updated every batch)."""

    __slots__ = ("settings", "overridden", "batches", "wait_cpu_s", "sampled_wait_s", "batch_size", "first")

    def __init__(self, settings: dict, overridden: dict):
        self.settings = settings          # OVERRIDABLE -> what the loader uses
        self.overridden = overridden      # what a tune trial changed
        self.batches = 0
        self.wait_cpu_s = self.sampled_wait_s = 0.0  # CPU demand while waiting, over the waits it was read
        self.batch_size: int | None = None
        self.first = _not_yet             # batch -> its first tensor (first_tensor_getter), once a batch came

    def samples(self, batch) -> int:
        """The samples in `batch` the general way; `first` is set for the next batches (`first(b).shape[0]`)."""
        self.first = first_tensor_getter(batch_path(batch))
        n = batch_len(batch)
        if n and self.batch_size is None:
            self.batch_size = n
        return n
