"""The tuner's trials, each run in a spawned child by `measure.child.run_isolated`.

Four kinds, all on the same `TrainStep` that plan, measure and watch use:

* `compute`: batches already on the device, no DataLoader -> the compute-only limit (samples/s);
* `fit`:     one warm-up and one step at a batch size -> does it fit (largest-safe-batch search);
* `loader`:  iterate the real DataLoader with no model -> what the input pipeline can deliver;
* `train`:   DataLoader -> copy to the device (non_blocking when pinned) -> step: the end-to-end rate.

Rates are steady state: warm-up batches (which include starting the workers and draining the
prefetched queue) are not timed; epoch restarts after that are, because a real run pays for them
(that is what `persistent_workers` saves). An OOM raises, so the parent sees status 'oom'.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ..cpu_isa import native_bf16
from ..devices.torch_device import with_index
from ..measuring.oom import maybe_fake_oom
from ..step import StepConfig, TrainStep
from ..workload import load_workload

KINDS = ("compute", "fit", "loader", "train")


def make_loader(dataset, batch_size: int, num_workers: int = 0, pin_memory: bool = False,
                prefetch_factor: int | None = None, persistent_workers: bool = False, collate_fn=None,
                multiprocessing_context: str | None = None):
    """The DataLoader a trial (and the user's snippet) builds; worker-only options only with workers."""
    import torch

    kwargs: dict[str, Any] = {"batch_size": batch_size, "shuffle": True, "drop_last": True,
                              "num_workers": num_workers, "pin_memory": pin_memory}
    if collate_fn is not None:
        kwargs["collate_fn"] = collate_fn
    if num_workers > 0:
        kwargs["persistent_workers"] = persistent_workers
        if multiprocessing_context is not None:
            kwargs["multiprocessing_context"] = multiprocessing_context
        if prefetch_factor is not None:
            kwargs["prefetch_factor"] = prefetch_factor
    return torch.utils.data.DataLoader(dataset, **kwargs)


def run_trial(workload: str, kind: str, batch_size: int, *, device: str = "cpu", precision: str | None = "fp32",
              optimizer: str | None = None, num_workers: int | None = 0, pin_memory: bool | None = False,
              prefetch_factor: int | None = None, persistent_workers: bool | None = False,
              measure_s: float = 2.0, min_steps: int = 3, warmup_steps: int = 2,
              warmup_s: float = 0.5, num_threads: int | None = None) -> dict[str, Any]:
    """Child entry point: one trial; returns samples_per_s, steps, startup_s and the peak memory.

    `num_threads` sets the step's intra-op threads (CPU device: leave the workers their cores)."""
    import torch

    if kind not in KINDS:
        raise ValueError(f"unknown trial kind {kind!r}; choose from {KINDS}")
    import warnings

    # the tuner tries more workers than CPUs on purpose (to see them get slower); torch warns each time
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    if num_threads:
        torch.set_num_threads(num_threads)
    wl = load_workload(workload)
    dev = with_index(torch.device(device))
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    if kind != "loader":
        maybe_fake_oom(batch_size)
    start = time.perf_counter()
    step = None if kind == "loader" else TrainStep(wl, StepConfig(optimizer=optimizer, precision=precision or "fp32"), dev)
    if kind in ("compute", "fit"):
        on_device = step.to_device(wl.build_batch(batch_size))
        batches = _repeat(on_device)
        if kind == "fit":
            warmup_steps, min_steps, measure_s, warmup_s = 1, 1, 0.0, 0.0
    else:
        ds = wl.build_dataset()
        if batch_size > len(ds):
            raise ValueError(f"batch size {batch_size} is larger than the dataset ({len(ds)} samples)")
        loader = make_loader(ds, batch_size, num_workers or 0, bool(pin_memory), prefetch_factor,
                             bool(persistent_workers), wl.collate_fn, multiprocessing_context=_platform_start_method())
        batches = _cycle(loader)
        if num_workers:
            warmup_steps = max(warmup_steps, num_workers * (prefetch_factor or 2) + 1)

    def one(b) -> None:
        if step is None:
            return
        if kind in ("compute", "fit"):
            step.step(b, on_device=True)
        else:
            step.step(step.to_device(b, non_blocking=bool(pin_memory)), on_device=True)

    startup_s = None
    i = 0
    while i < warmup_steps or time.perf_counter() - start - (startup_s or 0) < warmup_s:
        one(next(batches))  # warm-up: worker start, prefetch queue, allocator and oneDNN/cuDNN first runs
        if i == 0:
            _sync(dev)
            startup_s = time.perf_counter() - start
        i += 1
    _sync(dev)
    steps = 0
    t0 = time.perf_counter()
    while steps < min_steps or time.perf_counter() - t0 < measure_s:
        one(next(batches))
        steps += 1
        if dev.type == "cuda" and steps % 4 == 0:
            _sync(dev)
    _sync(dev)
    elapsed = time.perf_counter() - t0
    return {"samples_per_s": steps * batch_size / elapsed, "steps": steps, "measured_s": elapsed,
            "startup_s": startup_s, "num_threads": torch.get_num_threads(), **_peak_memory(dev)}


def _platform_start_method() -> str:
    """The start method a user's script gets by default on this platform (fork on Linux before Python
    3.14). A spawned trial child inherits 'spawn' from the tuner instead, which would pickle the dataset
    and fail for a workload file that is not an importable module."""
    import multiprocessing

    return multiprocessing.get_all_start_methods()[0]


def _repeat(batch):
    while True:
        yield batch


def _cycle(loader):
    while True:  # a new epoch re-creates the iterator (and the workers, unless persistent)
        yield from loader


def _sync(dev) -> None:
    if dev.type == "cuda":
        import torch

        torch.cuda.synchronize(dev)


def _peak_memory(dev) -> dict[str, Any]:
    if dev.type == "cuda":
        import torch

        return {"peak_memory_bytes": int(torch.cuda.max_memory_allocated(dev)), "memory_kind": "cuda_allocated"}
    import resource

    # ru_maxrss is KiB on Linux (getrusage(2)); the whole child's peak resident set, workers excluded
    return {"peak_memory_bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024,
            "memory_kind": "host_rss"}


def device_info(device: str) -> dict[str, Any]:
    """Child entry point: what precisions the device supports (probing CUDA never happens in the tuner)."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        props = torch.cuda.get_device_properties(dev)
        return {"type": "cuda", "name": props.name, "capability": f"{major}.{minor}",
                "total_memory_bytes": int(props.total_memory),
                "bf16": bool(torch.cuda.is_bf16_supported()), "tf32": major >= 8, "fp16": True}
    return {"type": dev.type, "name": dev.type, "cpu_bf16_native": cpu_has_native_bf16()}


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX-BF16 on the path oneDNN uses here (ONEDNN_MAX_CPU_ISA respected): without them
    CPU bf16 is emulated and slower than fp32."""
    return native_bf16()


def step_threads(device_type: str, num_workers: int | None, cpus: int) -> int | None:
    """Intra-op threads for the training step: on a CPU device, the cores the workers leave free, because
    OpenMP threads that share cores with workers spin and stall (PyTorch CPU performance tuning guide,
    "avoid oversubscription"); None (torch's default) otherwise."""
    if device_type != "cpu" or not num_workers:
        return None
    return max(1, cpus - num_workers)


def usable_cpus() -> int:
    """CPUs this process may run on (the affinity mask, as a container or taskset sees it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
