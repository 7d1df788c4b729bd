"""The monitor summary as a value: what the diagnosis rules read (as attributes) and what `to_dict()` turns
into docs/contracts.md's monitor-summary JSON (`mon.summary()`, `gpuwise watch --json`), key for key and in order.

Contract fields: `steps`, `step_time_s.median`, `data_wait_fraction`, `copy_fraction`, `compute_fraction`,
`findings`; the rest are extras. The nested parts (`step_time_s`, `split`, `loader`, `utilization`,
`memory`, `host`, `ranks`) stay plain dicts: their keys depend on what was sampled.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

# keys copied from the timeline's meta when present (an external watch, DDP), after the fields
EXTRA_KEYS = ("command", "exit_code", "world_size", "framework", "optimizer")
# ... and those the bootstrap's comm.parallel_meta writes (communication / oversubscription rules)
PARALLEL_KEYS = ("torch_threads", "usable_cores", "local_world_size", "omp_num_threads", "collectives",
                 "ddp_models", "allreduce_bytes_per_step", "allreduce_busy_s_per_step")


@dataclass
class Summary:
    steps: int = 0
    step_time_s: dict[str, Any] = field(default_factory=lambda: {"median": None})
    data_wait_fraction: float | None = None
    copy_fraction: float | None = None
    compute_fraction: float | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)
    communication_fraction: float | None = None  # waiting on collectives (bootstrap/comm.py); not in compute
    steady_steps: int = 0
    split: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    device_name: str | None = None
    capability: list[int] | None = None
    precision: str | None = None
    batch_size: int | None = None
    loader: dict[str, Any] = field(default_factory=dict)
    pinned_fraction: float | None = None
    batch_bytes: int | None = None
    utilization: dict[str, Any] = field(default_factory=lambda: {"samples": 0})
    memory: dict[str, Any] = field(default_factory=dict)
    host: dict[str, Any] = field(default_factory=dict)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    parallel: dict[str, Any] = field(default_factory=dict)  # PARALLEL_KEYS: collectives, threads, cores
    gpu_health: dict[str, Any] = field(default_factory=dict)  # clock reasons, PCIe link (monitoring/health.py)
    # B_simple from consecutive steps' gradients (monitoring/noise_scale.py); None: not measured
    gradient_noise_scale: dict[str, Any] | None = None
    extras: dict[str, Any] = field(default_factory=dict)  # EXTRA_KEYS (and any other key from a dict)
    cannot_tell: list[str] = field(default_factory=list)  # what the rules could not judge, and why (last key)

    @property
    def on_gpu(self) -> bool:
        return str(self.device or "").startswith("cuda")

    @property
    def command(self) -> list[str] | None:
        """The watched command (`gpuwise watch -- CMD`), when there was one."""
        return self.extras.get("command")

    @property
    def framework(self) -> str | None:
        """The training framework the bootstrap saw (transformers, lightning), when it saw one."""
        return self.extras.get("framework")

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("extras", "cannot_tell")}
        d.update(self.extras)
        d["cannot_tell"] = self.cannot_tell
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Summary:
        """A summary dict (e.g. written by hand, or read back from `--json`) as a Summary."""
        names = {f.name for f in fields(cls)} - {"extras"}
        if d.get("cannot_tell") is None:
            d = {k: v for k, v in d.items() if k != "cannot_tell"}
        return cls(**{k: v for k, v in d.items() if k in names},
                   extras={k: v for k, v in d.items() if k not in names})
