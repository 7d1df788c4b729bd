"""The child side of `measure`: build the step, warm up, time K steady steps, read the peaks.

`run_measurement(...)` is what `run_isolated` calls in a spawned child. `measure_here(...)` is the same
measurement in the current process, followed by a cleanup (`empty_cache`, cuBLAS workspaces cleared,
peak statistics reset) so that several configurations can share one process (the truth corpus does).

On CUDA: peaks from `torch.cuda.max_memory_allocated/reserved` after `reset_peak_memory_stats` at the
end of warm-up; device-level used memory from NVML for this process (falling back to the device's
used memory net of what was in use before CUDA started); step times from CUDA events.
On the CPU: the steady-step peak from the profiler (`plan/tracing/cpu_truth.py`, exact to the byte, docs/contracts.md),
step times from `perf_counter`.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from typing import Any

from ..devices import nvml
from ..devices.torch_device import with_index
from ..plan.tracing.cpu_truth import measure_cpu_peak
from ..step import StepConfig, TrainStep
from ..workload import load_workload
from . import progress
from .oom import maybe_fake_oom
from .snapshot import PhaseMarks
from .snapshot import save as save_snapshot

# device-used memory of each CUDA device before this process started CUDA (index -> bytes)
_BASELINE_USED: dict[int, int | None] = {}


def run_measurement(workload: str, batch_size: int, optimizer: str | None = None, precision: str = "fp32",
                    checkpointing: bool = False, device: str = "cpu", steps: int = 10, warmup: int = 2,
                    snapshot: str | None = None, cpu_peak: bool = True) -> dict[str, Any]:
    """Child entry point: one measurement, returned as a JSON-able dict (an OOM raises, the parent sees it)."""
    return measure_here(workload, batch_size, optimizer=optimizer, precision=precision,
                        checkpointing=checkpointing, device=device, steps=steps, warmup=warmup,
                        snapshot=snapshot, cpu_peak=cpu_peak)


def measure_here(workload: str, batch_size: int, *, optimizer: str | None = None, precision: str = "fp32",
                 checkpointing: bool = False, device: str = "cpu", steps: int = 10, warmup: int = 2,
                 snapshot: str | None = None, cpu_peak: bool = True, model=None) -> dict[str, Any]:
    """Measure one configuration in this process and clean up after it (also after an OOM).

    `model`: an already built CPU model to use instead of `workload.model()` (a fresh copy per call:
    the truth corpus builds each model once and deep-copies it, which is faster than initialising it).
    """
    import torch

    dev = with_index(torch.device(device))
    if dev.type == "cuda":
        _remember_baseline(dev.index)
        torch.cuda.set_device(dev.index)
    try:
        return _measure(workload, batch_size, optimizer, precision, checkpointing, dev, steps, warmup,
                        snapshot, cpu_peak, model)
    finally:
        cleanup(dev)


def _measure(spec, batch_size, optimizer, precision, checkpointing, dev, steps, warmup, snapshot, cpu_peak, model):
    import torch

    if steps < 1 or warmup < 1:
        raise ValueError("measure needs steps >= 1 and warmup >= 1 (the steady state starts after one step)")
    wl = load_workload(spec)
    config = StepConfig(optimizer=optimizer, precision=precision, checkpointing=checkpointing)
    cuda = dev.type == "cuda"
    if cuda and snapshot:  # python stacks only: C++ unwinding would slow every allocation down
        torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    step = TrainStep(wl, config, dev, model=model)
    del model
    marks = PhaseMarks(step, dev.index) if cuda and snapshot else None
    batch = wl.build_batch(batch_size)
    maybe_fake_oom(batch_size)
    total = warmup + steps
    for i in range(warmup):
        t0 = time.perf_counter()
        step.step(batch)
        _sync(dev)
        progress.step_done(i + 1, total, warmup, time.perf_counter() - t0)
    steady_start = None
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
        if marks is not None:  # where the steady steps begin in the allocator's trace
            steady_start = marks.trace_length()
    times_s = _timed_steps(step, batch, dev, steps, warmup)
    result: dict[str, Any] = {
        "workload": wl.spec, "batch_size": batch_size, "optimizer": config.optimizer or _optimizer_name(step),
        "precision": config.precision, "checkpointing": bool(checkpointing), "device": str(dev),
        "steps": steps, "warmup": warmup, "oom": False,
        "step_time_s": statistics.median(times_s), "step_times_s": times_s,
        "samples_per_s": batch_size / statistics.median(times_s) if min(times_s) > 0 else None,
        "peak_allocated_bytes": None, "peak_reserved_bytes": None, "device_used_bytes": None,
        "peak_method": None, "device_used_method": None, "snapshot": None,
    }
    result.update(environment(dev))
    if cuda:
        result["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated(dev))
        result["peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved(dev))
        result["peak_method"] = "torch.cuda.max_memory_allocated"
        used, method = device_used_bytes(dev.index)
        result["device_used_bytes"], result["device_used_method"] = used, method
        if snapshot:
            save_snapshot(snapshot, dev.index, steady_start, marks.marks)
            marks.remove()
            torch.cuda.memory._record_memory_history(enabled=None)
            result["snapshot"] = os.path.abspath(snapshot)
    elif cpu_peak:
        result["peak_allocated_bytes"], result["peak_method"] = cpu_peak_bytes(wl, batch_size, config)
    del step, batch
    return result


def _timed_steps(step, batch, dev, steps: int, warmup: int = 0) -> list[float]:
    import torch

    times_s = []
    if dev.type == "cuda":
        for _ in range(steps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step.step(batch)
            end.record()
            end.synchronize()
            times_s.append(start.elapsed_time(end) / 1000.0)  # elapsed_time is in milliseconds
            progress.step_done(warmup + len(times_s), warmup + steps, warmup, times_s[-1])
        return times_s
    for _ in range(steps):
        t0 = time.perf_counter()
        step.step(batch)
        _sync(dev)
        times_s.append(time.perf_counter() - t0)
        progress.step_done(warmup + len(times_s), warmup + steps, warmup, times_s[-1])
    return times_s


def cpu_peak_bytes(wl, batch_size: int, config) -> tuple[int, str]:
    """Peak of live CPU tensor bytes of a steady step: the plan's CPU truth (profiler, exact to the byte)."""
    return measure_cpu_peak(wl, batch_size, config), "plan.cpu_truth"


def _optimizer_name(step) -> str:
    return type(step.optimizer).__name__.lower()


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def cleanup(dev) -> None:
    """Give back what the last configuration held, so the next one starts like a fresh process."""
    import torch

    gc.collect()
    dev = torch.device(dev)
    if dev.type == "cuda" and torch.cuda.is_initialized():
        torch.cuda.synchronize(dev)
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()  # cuBLAS keeps per-handle workspaces alive in the caching allocator
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)


# ---- device-level memory (NVML) -------------------------------------------------------------------

def _nvml_index(cuda_index: int) -> int:
    import torch

    try:
        return int(torch.cuda._get_nvml_device_index(cuda_index))  # honours CUDA_VISIBLE_DEVICES
    except Exception:  # noqa: BLE001 - private helper; the plain index is right without masking
        return cuda_index


def _device_used_total(cuda_index: int) -> int | None:
    try:
        handle = nvml.query("nvmlDeviceGetHandleByIndex", _nvml_index(cuda_index))
        mem = nvml.query("nvmlDeviceGetMemoryInfo", handle) if handle is not None else None
    except nvml.NvmlUnavailable:
        return None
    return int(mem.used) if mem is not None else None


def _remember_baseline(cuda_index: int) -> None:
    """Device used memory before this process starts CUDA (first call per device only)."""
    import torch

    if cuda_index not in _BASELINE_USED:
        _BASELINE_USED[cuda_index] = None if torch.cuda.is_initialized() else _device_used_total(cuda_index)


def device_used_bytes(cuda_index: int) -> tuple[int | None, str | None]:
    """This process's device memory (context included): NVML per-process, else device used - baseline."""
    try:
        handle = nvml.query("nvmlDeviceGetHandleByIndex", _nvml_index(cuda_index))
        procs = nvml.query("nvmlDeviceGetComputeRunningProcesses", handle, default=[]) if handle is not None else []
    except nvml.NvmlUnavailable:
        procs = []
    for p in procs or []:
        used = getattr(p, "usedGpuMemory", None)
        if p.pid == os.getpid() and isinstance(used, int):
            return used, "nvml-process"
    total, base = _device_used_total(cuda_index), _BASELINE_USED.get(cuda_index)
    if total is not None and base is not None:
        return total - base, "nvml-device-minus-baseline"
    return None, None


def environment(dev) -> dict[str, Any]:
    """GPU name, driver, torch and CUDA versions (the truth-record contract's provenance fields)."""
    import torch

    env: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu_name": None, "driver": None}
    dev = torch.device(dev)
    if dev.type == "cuda":
        _remember_baseline(dev.index if dev.index is not None else 0)  # before this starts CUDA
        env["gpu_name"] = torch.cuda.get_device_name(dev)
        env["gpu_memory_total_bytes"] = int(torch.cuda.get_device_properties(dev).total_memory)
        try:
            drv = nvml.query("nvmlSystemGetDriverVersion")
            env["driver"] = drv.decode() if isinstance(drv, bytes) else drv
        except nvml.NvmlUnavailable:
            pass
    else:
        import platform

        env["gpu_name"] = None
        env["cpu_name"] = platform.processor() or platform.machine()
    return env
