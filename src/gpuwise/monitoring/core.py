"""`gpuwise.monitor()`: per-step data-wait / copy / compute timing around a training loop, plus sampling.

    with gpuwise.monitor(device="cuda:0", report="run.html") as mon:
        for x, y in mon.loader(train_loader):        # times the wait for each batch
            x, y = mon.to_device((x, y))             # times the host-to-device copy (optional)
            loss = step(x, y)                        # the rest of the step counts as compute
    print(mon.summary()["findings"])

A step runs from asking for batch i to asking for batch i+1. Without `loader()`, call `mon.step()` at
the end of each step and wrap parts in `with mon.phase("data" | "copy" | "compute")`; when only
compute (and copy) are wrapped, the unwrapped rest of the step counts as data wait. Times are host wall
clock; on a GPU, CUDA events also give each step's device time and the device's idle gap before it.
Per step the monitor does two `perf_counter()` calls and one list append (benchmarks/monitor_overhead.py).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import Any

from ..bootstrap import noise
from ..bootstrap.hooks import thread_demand_s
from ..devices.torch_device import resolve_device, with_index
from ..plan.hint import planner_max_batch
from ..step import batch_bytes, move_to, tensors_in
from . import cuda
from .sampler import Sampler, default_gpu_source, nvml_index_for
from .summary import summarize
from .timeline import ENV_DIR, StepRecord, Timeline, TimelineWriter, free_rank_file

PHASES = ("data", "copy", "compute")


class Monitor:
    """Collects a `Timeline`; see the module docstring. Use through `gpuwise.monitor(...)`."""

    def __init__(self, device=None, interval_s: float = 0.1, sample: bool = True,
                 precision: str | None = None, batch_size: int | None = None, workload: str | None = None,
                 out_dir: str | None = None, rank: int | None = None, gpu_source=None, quiet: bool = True,
                 on_stop: Callable[[Monitor], None] | None = None):
        """`on_stop(monitor)` runs once the run is over and its timeline complete (e.g. `gpuwise.monitor`'s
        `report=` writes the HTML report there)."""
        self.device = _resolve_device(device)
        self.on_stop = on_stop
        self.interval_s = interval_s
        self.sample = sample
        self.rank = int(os.environ.get("RANK", "0")) if rank is None else rank
        self.out_dir = out_dir if out_dir is not None else os.environ.get(ENV_DIR)
        self.quiet = quiet
        self.timeline = Timeline(meta={
            "device": str(self.device), "rank": self.rank, "precision": precision, "batch_size": batch_size,
            "workload": workload, "pid": os.getpid(), "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        })
        self._gpu_source = gpu_source
        self._cuda = self.device.type == "cuda"
        self._sampler: Sampler | None = None
        self._writer: TimelineWriter | None = None
        self._t0 = 0.0
        self._step_start: float | None = None
        self._acc = {"data": 0.0, "copy": 0.0, "compute": 0.0}
        self._phase_used = {"data": False, "copy": False, "compute": False}
        self._in_loader_step = False
        self._pinned_seen = [0, 0]  # pinned batches, batches checked
        self._looked = 0  # batches looked at (the first 8)
        self._loader_busy = [0.0, 0.0]  # CPU and wall seconds the main process spent loading (num_workers=0)
        self._events: list[tuple[StepRecord, Any, Any, Any]] = []  # (step, previous end, start, end) CUDA events to resolve
        self._prev_end_event = None
        self._start_event = None
        self._autocast_hook = None
        self._noise = self._noise_hook = None  # the gradient noise scale's probe (bootstrap/noise.py)

    # -- lifecycle -----------------------------------------------------------------------------------
    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop(error=exc[0] is not None)

    def start(self) -> Monitor:
        self._t0 = time.perf_counter()
        self.timeline.meta["t0_unix"] = time.time()
        self._describe_device()
        if self._cuda and self.timeline.meta.get("precision") is None:
            import torch

            # one call: the first module forward inside the monitored loop says whether autocast is on
            self._autocast_hook = torch.nn.modules.module.register_module_forward_pre_hook(self._look_at_autocast)
        self._hook_noise()
        if self.out_dir:
            self._writer = TimelineWriter(free_rank_file(self.out_dir, self.rank), self.timeline.meta)
        if self.sample:
            source, note = (self._gpu_source, "") if self._gpu_source is not None else default_gpu_source()
            if not self._cuda:
                self.timeline.notes.append("no GPU in use: sampled CPU and RAM only")
            elif note:
                self.timeline.notes.append(note)
            index = nvml_index_for(self.device) if self._cuda else None
            indices = [index] if index is not None and source is not None else []
            self._sampler = Sampler(self.timeline, self.interval_s, indices, source, t0=self._t0, rank=self.rank,
                                    on_tick=self._flush_maybe).start()
        return self

    def stop(self, error: bool = False) -> None:
        if self._step_start is not None and not error and (self._in_loader_step or any(self._phase_used.values())):
            self._end_step(time.perf_counter(), partial=True)  # a loop left early: its last step did run
        if self._sampler is not None:
            self._sampler.stop()
            self.timeline.notes.extend(f"sampler error: {e}" for e in self._sampler.errors)
            self._sampler = None
        self._resolve_events(wait=True)
        if self._autocast_hook is not None:
            self._autocast_hook.remove()
            self._autocast_hook = None
        if self._noise_hook is not None:
            self._noise_hook.remove()
            self._noise_hook = None
            self.timeline.noise.extend(dict(zip(noise.ROW_KEYS, r)) for r in self._noise.rows())
            if self._noise.opt_name:
                self.timeline.meta.setdefault("optimizer", self._noise.opt_name)
        meta = self.timeline.meta
        if self._pinned_seen[1]:
            meta["pinned_fraction"] = self._pinned_seen[0] / self._pinned_seen[1]
        if self._loader_busy[1] > 0:
            meta["loader_cpu_busy_fraction"] = min(self._loader_busy[0] / self._loader_busy[1], 1.0)
        if self._cuda:
            meta["peak_allocated_bytes"], meta["peak_reserved_bytes"] = cuda.peak_bytes(self.device)
        meta["ended_with_error"] = error
        if self._writer is not None:
            self._writer.close(self.timeline)
        if self.on_stop is not None:
            self.on_stop(self)

    # -- the loop ------------------------------------------------------------------------------------
    def loader(self, iterable):
        """Iterate `iterable`, timing the wait for each batch; each new batch starts a new step."""
        self._describe_loader(iterable)
        it = iter(iterable)
        clock = time.perf_counter
        acc, used, cuda = self._acc, self._phase_used, self._cuda  # the hot loop: locals, containers reused
        # The main process loads (num_workers=0): its CPU demand while waiting says CPU-bound or I/O.
        cpu_clock = thread_demand_s if getattr(iterable, "num_workers", None) == 0 else None
        busy = self._loader_busy  # [CPU seconds, wall seconds] of the waits
        while True:
            t = clock()
            if self._step_start is not None:
                self._end_step(t)
            c = cpu_clock() if cpu_clock else 0.0
            try:
                batch = next(it)
            except StopIteration:
                return
            now = clock()
            if cpu_clock:
                busy[0] += cpu_clock() - c
                busy[1] += now - t
            if cuda:
                self._begin_step(t)
            else:
                self._step_start = t
            acc["data"] += now - t
            used["data"] = True
            if self._looked < 8:
                self._look_at_batch(batch)
            self._in_loader_step = True
            yield batch

    def step(self) -> None:
        """Mark the end of a step (and the start of the next) when not iterating through `loader()`."""
        now = time.perf_counter()
        if self._step_start is None:
            self._step_start = self._t0 if not self.timeline.steps else now
        self._end_step(now)
        self._begin_step(now)

    @contextlib.contextmanager
    def phase(self, name: str):
        """Time a part of the step: 'data', 'copy' or 'compute'."""
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; choose from {PHASES}")
        if self._step_start is None:
            self._begin_step(time.perf_counter())
        t = time.perf_counter()
        try:
            yield
        finally:
            self._acc[name] += time.perf_counter() - t
            self._phase_used[name] = True

    def begin_step(self) -> None:
        """Start a step now (framework hooks: the first `on_train_batch_start`)."""
        self._begin_step(time.perf_counter())

    def cancel_step(self) -> None:
        """Drop the step in progress (a framework's last boundary opens a step that never runs)."""
        self._step_start = None
        self._start_event = None
        self._acc["data"] = self._acc["copy"] = self._acc["compute"] = 0.0

    def add_time(self, phase: str, seconds: float) -> None:
        """Add time measured elsewhere to the current step's phase (framework hooks that see only boundaries)."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; choose from {PHASES}")
        self._acc[phase] += seconds
        self._phase_used[phase] = True

    def observe_batch(self, batch) -> None:
        """Note the batch size, bytes and (for CPU tensors bound for a GPU) whether it is pinned."""
        if self._looked < 8:
            self._look_at_batch(batch)

    def describe_loader(self, loader) -> None:
        """Record a DataLoader's num_workers / pin_memory / persistent_workers / prefetch_factor / batch_size."""
        self._describe_loader(loader)

    def to_device(self, batch, device=None, non_blocking: bool = True):
        """Move a Tensor / tuple / list / dict batch to the device, timing it as the copy phase."""
        if self._looked < 8:
            self._look_at_batch(batch)
        with self.phase("copy"):
            return move_to(batch, device or self.device, non_blocking=non_blocking)

    # -- results -------------------------------------------------------------------------------------
    def summary(self) -> dict:
        """The docs/contracts.md monitor summary: steps, step_time_s.median, fractions, findings (+ extras); on a
        CUDA run with memory to spare, the planner names the largest batch (plan/hint.py)."""
        return summarize(self.timeline, planner=planner_max_batch)

    # -- internals -----------------------------------------------------------------------------------
    def _begin_step(self, t: float) -> None:
        self._step_start = t
        if self._cuda:
            self._start_event = cuda.timing_event()

    def _end_step(self, t: float, partial: bool = False) -> None:
        # the hot path (once per step): plain arithmetic, one record, no new containers
        start = self._step_start
        if start is None:
            return
        acc, used = self._acc, self._phase_used
        total = t - start
        data, copy, compute = acc["data"], acc["copy"], acc["compute"]
        rest = total - data - copy - compute
        if rest > 0:
            if used["compute"] and not used["data"]:
                data += rest  # the unwrapped part of a loop is where it waits for the loader
            else:
                compute += rest
        steps = self.timeline.steps
        rec = StepRecord(len(steps), start - self._t0, total, data, copy, compute, None, None, None, self.rank)
        if self._cuda and self._start_event is not None:
            self._cuda_end(rec)
        if not partial or total > 0:
            steps.append(rec)
        acc["data"] = acc["copy"] = acc["compute"] = 0.0
        used["data"] = used["copy"] = used["compute"] = False
        self._in_loader_step = False
        self._step_start = None

    def _cuda_end(self, rec: StepRecord) -> None:
        end = cuda.timing_event()
        rec.memory_allocated_bytes = cuda.allocated_bytes(self.device)
        self._events.append((rec, self._prev_end_event, self._start_event, end))
        self._prev_end_event = end
        self._start_event = None
        if len(self._events) > 16:
            self._resolve_events(wait=False)

    def _resolve_events(self, wait: bool) -> None:
        # the records themselves, not indices: the step being ended is not in timeline.steps yet
        keep = []
        for rec, prev_end, start, end in self._events:
            if not wait and not end.query():
                keep.append((rec, prev_end, start, end))
                continue
            end.synchronize()
            rec.gpu_s = start.elapsed_time(end) / 1000  # elapsed_time is in milliseconds
            if prev_end is not None:
                rec.gpu_idle_s = prev_end.elapsed_time(start) / 1000
        self._events = keep

    def _flush_maybe(self) -> None:
        if self._writer is not None:
            now = time.perf_counter()
            if now - getattr(self, "_last_flush", 0.0) >= 1.0:
                self._last_flush = now
                self._writer.flush(self.timeline)

    def _look_at_batch(self, batch) -> None:
        """The first few batches only: batch size, bytes, pinned or not."""
        self._looked += 1
        tensors = tensors_in(batch)
        if not tensors:
            return
        meta = self.timeline.meta
        if meta.get("batch_size") is None and tensors[0].dim() > 0:
            meta["batch_size"] = int(tensors[0].shape[0])
        if tensors[0].device.type != "cpu":
            return
        meta.setdefault("batch_bytes", batch_bytes(batch))
        if self._cuda:  # is_pinned() needs CUDA; only meaningful when a copy to a GPU follows
            self._pinned_seen[0] += all(t.is_pinned() for t in tensors)
            self._pinned_seen[1] += 1

    def _hook_noise(self) -> None:
        """Read the gradients of pairs of optimizer steps for the gradient noise scale, unless gpuwise's
        bootstrap (`gpuwise watch`) already does in this process."""
        import torch

        if getattr(torch, "_gpuwise_hooked", False):
            return
        meta = self.timeline.meta
        self._noise, self._noise_hook = noise.install(torch, lambda: meta.get("batch_size") or 0)

    def _look_at_autocast(self, *_args) -> None:
        """Precision of the first module forward (a global pre-hook, removed at once): autocast dtype, else tf32/fp32."""
        if self._autocast_hook is not None:
            self._autocast_hook.remove()
            self._autocast_hook = None
        meta = self.timeline.meta
        if not self._cuda or meta.get("precision") is not None:
            return
        meta["precision"] = cuda.autocast_precision()

    def _describe_device(self) -> None:
        meta = self.timeline.meta
        if not self._cuda:
            meta.setdefault("device_name", "CPU")
            meta["cpu_count"] = os.cpu_count()
            return
        meta.update(**cuda.describe(self.device), cpu_count=os.cpu_count())

    def _describe_loader(self, iterable) -> None:
        meta = self.timeline.meta
        for name in ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor"):
            if hasattr(iterable, name):
                meta[f"loader_{name}"] = getattr(iterable, name)
        bs = getattr(iterable, "batch_size", None)
        if meta.get("batch_size") is None and isinstance(bs, int):
            meta["batch_size"] = bs


def _resolve_device(device):
    """devices.resolve_device's answer as a torch.device; plain "cuda" is the current CUDA device."""
    import torch

    return with_index(torch.device(resolve_device(None if device is None else str(device), other_types=True)))
