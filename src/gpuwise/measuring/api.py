"""`gpuwise.measure(...)`: real steps of a workload on a device, in a child process, as a `Measurement`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..devices.torch_device import resolve_device
from ..errors import GpuwiseError
from ..step import StepConfig
from ..truth import truth_record
from ..workload import check_batch_size, load_workload
from .child import run_isolated


@dataclass
class Measurement:
    """What one configuration really did on a device: peaks, device-level memory, step times."""

    workload: str
    batch_size: int
    optimizer: str | None
    precision: str
    checkpointing: bool
    device: str
    steps: int
    warmup: int
    oom: bool = False
    error: str = ""                              # the OOM (or other) message, one line
    peak_allocated_bytes: int | None = None      # tensor bytes at the steady-state peak
    peak_reserved_bytes: int | None = None       # CUDA caching allocator's reserved bytes at the peak
    device_used_bytes: int | None = None         # what nvidia-smi shows for this process (context included)
    step_time_s: float | None = None             # median over the steady steps
    step_times_s: list[float] = field(default_factory=list)
    samples_per_s: float | None = None
    peak_method: str | None = None               # how the peak was read (torch.cuda stats, CPU profiler timeline)
    device_used_method: str | None = None        # nvml-process | nvml-device-minus-baseline
    gpu_name: str | None = None
    driver: str | None = None
    torch: str | None = None
    cuda: str | None = None
    snapshot: str | None = None                  # path of the saved CUDA memory snapshot
    seconds: float = 0.0                         # wall time of the child process

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_truth_record(self) -> dict[str, Any]:
        """The docs/contracts.md truth record (one line of benchmarks/truth/<gpu>.jsonl; gpuwise/truth.py)."""
        return truth_record(self.to_dict())

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Measurement:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in names})


def measure(workload, batch_size: int, optimizer: str | None = None, precision: str = "fp32",
            checkpointing: bool = False, steps: int = 10, warmup: int = 2, device: str | None = None,
            snapshot: str | None = None, timeout_s: float | None = 1800,
            env: dict[str, str] | None = None, on_progress=None) -> Measurement:
    """Run `warmup` + `steps` training steps of `workload` at `batch_size` in a spawned child and measure.

    `workload`: a spec string (path.py, pkg.mod, examples:NAME) or a loaded `Workload`. `device`: cpu,
    cuda, cuda:N (default: cuda when available, else cpu). `on_progress(StepProgress)` is called in this
    process after each step the child finished (`measure.progress`). An OOM returns a Measurement with
    `oom=True` (the caller's memory is untouched); other failures raise `GpuwiseError`.
    """
    wl = load_workload(workload)  # a bad spec is one line here, not a child traceback
    check_batch_size(batch_size)
    if steps < 1 or warmup < 1:
        raise GpuwiseError("measure needs --steps >= 1 and a warm-up of >= 1 step (steady state starts after it)")
    config = StepConfig(optimizer=optimizer, precision=precision, checkpointing=checkpointing)
    optimizer_used = config.optimizer or (None if wl.optimizer_fn is not None else "adamw")
    dev = resolve_device(device)
    if snapshot and not dev.startswith("cuda"):
        raise GpuwiseError("--snapshot records the CUDA caching allocator: it needs a cuda device")
    kwargs = {"workload": wl.spec, "batch_size": batch_size, "optimizer": config.optimizer,
              "precision": config.precision, "checkpointing": checkpointing, "device": dev, "steps": steps,
              "warmup": warmup, "snapshot": snapshot}
    res = run_isolated("gpuwise.measuring.runner:run_measurement", kwargs, timeout_s=timeout_s, env=env,
                       on_progress=on_progress)
    base = {"workload": wl.spec, "batch_size": batch_size, "optimizer": optimizer_used,
            "precision": config.precision, "checkpointing": checkpointing, "device": dev, "steps": steps,
            "warmup": warmup, "seconds": res.seconds}
    if res.ok:
        return Measurement.from_dict({**res.value, "seconds": res.seconds})
    if res.oom:
        return Measurement(**base, oom=True,
                           error=f"out of memory at batch size {batch_size} on {dev}: {res.error}")
    hint = " (the host may have run out of memory)" if res.status == "killed" else ""
    raise GpuwiseError(f"measuring {wl.spec} at batch size {batch_size} failed: {res.error}{hint}")
