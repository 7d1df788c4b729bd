"""Device snapshots: frozen records with units in the names (bytes, pct, w, c)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..units import fmt_bytes


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int | None = None
    user: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class Gpu:
    """One GPU as seen at one moment. `index` is the NVML / PCI-bus index (what nvidia-smi shows)."""

    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    utilization_pct: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    pci_bus_id: str | None = None
    processes: tuple[GpuProcess, ...] = field(default_factory=tuple)
    backend: str = "nvml"

    @property
    def memory_free_bytes(self) -> int:
        return max(self.memory_total_bytes - self.memory_used_bytes, 0)

    @property
    def memory_free_human(self) -> str:
        return fmt_bytes(self.memory_free_bytes)

    @property
    def device(self) -> str:
        return f"cuda:{self.index}"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["memory_free_bytes"] = self.memory_free_bytes
        d["processes"] = [asdict(p) for p in self.processes]
        return d


@dataclass(frozen=True)
class HostDevice:
    """A non-GPU device gpuwise can run on: the CPU, or Apple's MPS."""

    kind: str  # "cpu" or "mps"
    name: str
    cores: int | None = None
    memory_total_bytes: int | None = None
    memory_available_bytes: int | None = None

    @property
    def device(self) -> str:
        return self.kind

    def to_dict(self) -> dict:
        return asdict(self)
