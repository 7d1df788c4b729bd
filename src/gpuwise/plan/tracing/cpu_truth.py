"""The CPU target's truth: the steady-state step's peak as PyTorch's profiler sees the CPU allocator.

Runs the same step as the tracer (`gpuwise.step.TrainStep`: model and optimizer built, batch on the
device, one warm-up step, then the steady step) on real CPU tensors under
`torch.profiler.profile(profile_memory=True)`, from before the model is built so that every live byte
is known. Each `[memory]` event is one call of the CPU allocator (c10's DefaultCPUAllocator reports
every allocation and free to the profiler, `reportMemoryUsageToProfiler`); the running sum of their
sizes is the bytes live, and its maximum inside the steady step is the peak. This is what the memory
timeline (`torch.profiler._memory_profiler`) is built from, so it agrees with it to the byte.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...profiling import cpu_memory_profile
from ...step import StepConfig, TrainStep
from ...workload import load_workload

STEADY_MARK = "gpuwise::steady_step"


@dataclass(frozen=True)
class CpuPeak:
    peak_bytes: int          # highest live CPU-allocator bytes during the steady step
    start_bytes: int         # live when the steady step started (model, optimizer state, batch)
    allocations: int         # allocator calls inside the steady step


def measure_cpu_peak(workload, batch_size: int, config: StepConfig | None = None) -> int:
    """Steady-state step peak of CPU-allocator bytes, measured on a real CPU step with the profiler."""
    return measure_cpu(workload, batch_size, config).peak_bytes


def measure_cpu(workload, batch_size: int, config: StepConfig | None = None) -> CpuPeak:
    import torch
    from torch.profiler import record_function

    workload = load_workload(workload)
    config = config or StepConfig()
    torch.manual_seed(0)
    with cpu_memory_profile() as prof:
        step = TrainStep(workload, config, "cpu")
        batch = step.to_device(workload.build_batch(batch_size))
        step.step(batch, on_device=True)
        with record_function(STEADY_MARK):
            step.step(batch, on_device=True)
        del step, batch
    return _peak_from_profile(prof)


def peak_in_profile(prof, totals: bool = False) -> CpuPeak:
    """The peak inside the `STEADY_MARK` range of a `cpu_memory_profile` that began before anything was
    allocated (also used by `gpuwise train --measure-peak`, on each rank). `totals`: a profile taken with
    `all_threads=True`, whose live bytes are the allocator's total over every thread (frees on gloo's
    worker threads included) rather than the sum of the profiled thread's events."""
    return _peak_from_profile(prof, totals)


def _peak_from_profile(prof, totals: bool = False) -> CpuPeak:
    window = None
    allocs: list[tuple[int, int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.name == STEADY_MARK:
            window = (node.start_time_ns, node.end_time_ns)
        fields = node.extra_fields
        size = getattr(fields, "alloc_size", None)
        if size is not None and str(getattr(fields, "device", "cpu")).startswith("cpu"):
            allocs.append((node.start_time_ns, size, getattr(fields, "total_allocated", 0)))
        stack.extend(node.children)
    if window is None:
        raise RuntimeError("the profiler recorded no steady step")
    allocs.sort(key=lambda a: a[0])
    # the allocator's total counts from its first tracked allocation: live = total - (its total before)
    base = allocs[0][2] - allocs[0][1] if totals and allocs else 0
    live, start, peak, count = 0, None, 0, 0
    for t, size, total in allocs:
        if t > window[1]:
            break
        if t >= window[0]:
            if start is None:  # with totals: what the allocator held just before (frees since, on any thread)
                start = peak = total - size - base if totals else live
            count += 1
        live = total - base if totals else live + size
        if t >= window[0]:
            peak = max(peak, live)
    if start is None:
        start = peak = live
    return CpuPeak(peak, start, count)


peak_from_profile = _peak_from_profile  # the profile's steady-step peak, for another profiled run (inference)
