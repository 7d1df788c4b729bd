"""A background thread sampling GPUs (NVML, or the fake-GPU file) and the host (psutil) every interval.

GPU numbers come from `gpuwise.devices.nvml.sample(index)` (the one NVML seam). With
`GPUWISE_FAKE_GPUS` set they come from the fake file instead, re-read on every tick, so tests and
users' CI can script utilisation. Without NVML the sampler records CPU/RAM only and says so in a note.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from ..devices import discover, fake, nvml
from . import cuda
from .timeline import Sample, Timeline

GpuSource = Callable[[int], dict]  # NVML index -> {"utilization_pct", "memory_used_bytes", "power_w", ...}


def fake_sample(index: int) -> dict:
    """A sample from the fake-GPU file (docs/contracts.md contract), same keys as `nvml.sample`."""
    for h in fake.read_fake_health(fake.fake_path() or ""):
        if h.gpu.index == index:
            g = h.gpu
            return {"utilization_pct": g.utilization_pct, "memory_used_bytes": float(g.memory_used_bytes),
                    "memory_total_bytes": float(g.memory_total_bytes), "power_w": g.power_w, **fake.sample_fields(h)}
    return {}


def nvml_sample(index: int) -> dict:
    s = nvml.sample(index)
    h = nvml.query("nvmlDeviceGetHandleByIndex", index)
    mem = nvml.query("nvmlDeviceGetMemoryInfo", h) if h is not None else None
    limit = nvml.query("nvmlDeviceGetEnforcedPowerLimit", h) if h is not None else None
    if mem is not None:
        s["memory_total_bytes"] = float(mem.total)
    if limit is not None:
        s["power_limit_w"] = limit / 1000  # NVML reports milliwatts
    return s


def default_gpu_source() -> tuple[GpuSource | None, str]:
    """(source, note): the fake file, else NVML, else None with the reason."""
    if fake.fake_path():
        return fake_sample, ""
    try:
        nvml.init()
    except nvml.NvmlUnavailable as exc:
        return None, f"no GPU sampling ({exc}): recording CPU and RAM only"
    return nvml_sample, ""


class Sampler:
    """Samples every `interval_s` into `timeline.samples` until `stop()`.

    `gpu_indices` (NVML indices) may be a callable re-evaluated every `rescan_s` (watch: the GPUs the
    child's process tree is using). `pids` (a callable, also re-evaluated every `rescan_s`) gives the
    processes to attribute CPU and RSS to; default this process and its children (DataLoader workers).
    The host (CPU, RSS, RAM) is read every `host_interval_s` (0.5 s: it costs ~0.3 ms of psutil), the
    GPUs every tick. `on_tick` runs after each sample (the monitor flushes its file there).
    """

    def __init__(self, timeline: Timeline, interval_s: float = 0.1, gpu_indices=(), gpu_source: GpuSource | None = None,
                 pids: Callable[[], list[int]] | None = None, t0: float | None = None, rank: int = 0,
                 on_tick: Callable[[], None] | None = None, rescan_s: float = 1.0, host_interval_s: float = 0.5):
        import psutil

        self._psutil = psutil
        self.timeline = timeline
        self.interval_s = interval_s
        self.gpu_source = gpu_source
        self._gpu_indices = gpu_indices
        self._indices: list[int] = [] if callable(gpu_indices) else list(gpu_indices)
        self._pids = pids or (lambda: process_tree(os.getpid()))  # this process and its DataLoader workers
        self._pid_list: list[int] = []
        self._procs: dict[int, object] = {}
        self.t0 = time.perf_counter() if t0 is None else t0
        self.rank = rank
        self.on_tick = on_tick
        self.rescan_s = rescan_s
        self._last_scan = -1e9
        self.host_interval_s = max(interval_s, host_interval_s)
        self._last_host = -1e9
        self._host_primed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuwise-monitor-sampler", daemon=True)
        self.errors: list[str] = []

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=max(2.0, 4 * self.interval_s))
        self.sample_once(force_host=True)  # one last sample, so even a very short run has one

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample_once()

    def _cpu_and_rss(self) -> tuple[float | None, int | None]:
        psutil = self._psutil
        cpu = 0.0
        rss = 0
        alive = {}
        for pid in self._pid_list:
            proc = self._procs.get(pid)
            try:
                if proc is None:
                    proc = psutil.Process(pid)
                    proc.cpu_percent(None)  # prime; counts from the next tick
                mem = proc.memory_info().rss
                if mem == 0:  # a zombie: ended, not yet reaped
                    continue
                cpu += proc.cpu_percent(None)
                rss += mem
                alive[pid] = proc
            except (psutil.Error, OSError):
                continue
        self._procs = alive
        return (cpu, rss) if alive else (None, None)

    def sample_once(self, force_host: bool = False) -> None:
        """One tick: the GPUs every time, the host (psutil, ~0.3 ms) every `host_interval_s`."""
        try:
            now = time.perf_counter()
            if now - self._last_scan >= self.rescan_s:  # process trees and GPU processes: once a second
                self._pid_list = list(self._pids())
                if callable(self._gpu_indices):
                    self._indices = list(self._gpu_indices())
                self._last_scan = now
            gpus = {i: self.gpu_source(i) for i in self._indices} if self.gpu_source is not None else {}
            host = force_host or now - self._last_host >= self.host_interval_s
            if not gpus and not host:
                return
            s = Sample(t_s=now - self.t0, gpus=gpus, rank=self.rank)
            if host:
                self._last_host = now
                proc_cpu, s.rss_bytes = self._cpu_and_rss()
                cpu = self._psutil.cpu_percent(None)
                if self._host_primed:  # psutil's CPU percentages count from the previous call: skip the first
                    s.proc_cpu_pct, s.cpu_pct = proc_cpu, cpu
                self._host_primed = True
                s.ram_used_pct = self._psutil.virtual_memory().percent
            self.timeline.samples.append(s)
            if self.on_tick is not None:
                self.on_tick()
        except Exception as exc:  # a sampler must never kill the training it watches
            if len(self.errors) < 5:
                self.errors.append(f"{type(exc).__name__}: {exc}")


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants, or [] when it has ended.

    Linux's /proc/PID/task/TID/children lists a process's children directly (tens of microseconds);
    psutil's `children(recursive=True)` scans every process on the machine (milliseconds), so it is
    only the fallback.
    """
    tree = _tree_from_proc(pid)
    if tree is not None:
        return tree
    import psutil

    try:
        root = psutil.Process(pid)
        return [pid] + [c.pid for c in root.children(recursive=True)]
    except (psutil.Error, OSError):
        return []


def _tree_from_proc(pid: int) -> list[int] | None:
    """None where /proc has no `children` files (not Linux, or a kernel without CONFIG_PROC_CHILDREN)."""
    if not os.path.exists(f"/proc/{pid}/task/{pid}/children"):
        return None if not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children") else []
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue  # ended meanwhile
        for tid in tasks:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as fh:
                    todo.extend(int(c) for c in fh.read().split())
            except OSError:
                continue
    return out


def gpus_of_pids(pids: set[int]) -> list:
    """The GPUs (`Gpu` snapshots, fake file or NVML) on which any of `pids` has a process."""
    try:
        gpus = discover().gpus
    except Exception:
        return []
    return [g for g in gpus if any(p.pid in pids for p in g.processes)]


def nvml_index_for(device) -> int | None:
    """The NVML (PCI-bus) index of torch device `cuda:i`, through CUDA_VISIBLE_DEVICES when it is set."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return None
    i = device.index if device.index is not None else cuda.current_index()
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if not visible:
        return i
    if i >= len(visible):
        return None
    entry = visible[i]
    if entry.isdigit():
        return int(entry)
    for g in discover().gpus:  # a UUID (or a MIG id, which we cannot sample per instance)
        if g.uuid == entry or g.uuid.startswith(entry):
            return g.index
    return None
