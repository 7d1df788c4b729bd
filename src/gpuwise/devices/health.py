"""What `gpuwise doctor` and `watch` read about a GPU beyond memory and utilisation: PCIe link, clock
event ("throttle") reasons, temperature thresholds, compute mode, MIG, ECC, persistence mode.

Every field is `None` when the backend did not report it (an old driver, a GPU without the feature, a
fake-GPU file without the field): the checks then say "cannot tell" instead of assuming the best.
NVML fills these in `devices.nvml.read_health`, the fake backend in `devices.fake.read_fake_health`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .model import Gpu

# Clock event reasons, bit -> name. Source: NVIDIA NVML API reference, `nvmlClocksEventReason*` (formerly
# `nvmlClocksThrottleReason*`) constants in nvml.h; the same values are exported by nvidia-ml-py.
CLOCK_REASONS: dict[int, str] = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
THERMAL_REASONS = frozenset({"sw_thermal_slowdown", "hw_thermal_slowdown"})
POWER_REASONS = frozenset({"sw_power_cap", "hw_power_brake_slowdown"})
HW_REASONS = frozenset({"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"})

# Usable bandwidth per lane and direction in GB/s (10^9 bytes) after line encoding: gen1/2 8b/10b at
# 2.5/5 GT/s, gen3+ 128b/130b at 8/16/32/64 GT/s (gen6 1b/1b FLIT). Source: PCI-SIG specifications as
# tabulated in Wikipedia "PCI Express", section "Comparison table" (x1 column).
PCIE_LANE_GB_S = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


def reason_names(mask: int | None) -> list[str] | None:
    """The names of the bits set in an NVML clock-event bitmask (unknown bits as hex)."""
    if mask is None:
        return None
    names = [name for bit, name in CLOCK_REASONS.items() if mask & bit]
    rest = mask & ~sum(CLOCK_REASONS)
    if rest:
        names.append(f"0x{rest:x}")
    return names


def reason_mask(names) -> int:
    """The inverse of `reason_names` (fake-GPU files list names)."""
    by_name = {v: k for k, v in CLOCK_REASONS.items()}
    mask = 0
    for n in names:
        if n not in by_name:
            raise ValueError(f"unknown clock reason {n!r}; choose from {sorted(by_name)}")
        mask |= by_name[n]
    return mask


def pcie_bandwidth_bytes_per_s(gen: int | None, width: int | None) -> float | None:
    """Theoretical one-direction bandwidth of a PCIe link (bytes/s), or None when gen/width are unknown."""
    if not gen or not width or gen not in PCIE_LANE_GB_S:
        return None
    return PCIE_LANE_GB_S[gen] * 1e9 * width


@dataclass(frozen=True)
class MigDevice:
    uuid: str
    name: str | None = None
    memory_total_bytes: int | None = None


@dataclass(frozen=True)
class GpuHealth:
    """One GPU's health snapshot: the `Gpu` plus what the doctor checks read (None = not reported)."""

    gpu: Gpu
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None        # the link's maximum (GPU and slot together)
    pcie_gen_gpu_max: int | None = None    # the GPU's own maximum
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    clock_reasons_mask: int | None = None  # NVML clock event reasons bitmask
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    temperature_slowdown_c: float | None = None
    temperature_shutdown_c: float | None = None
    compute_mode: str | None = None        # default | exclusive_process | exclusive_thread | prohibited
    mig_enabled: bool | None = None
    mig_devices: tuple[MigDevice, ...] = field(default_factory=tuple)
    ecc_enabled: bool | None = None
    ecc_uncorrected_volatile: int | None = None
    retired_pages: int | None = None
    retired_pages_pending: bool | None = None
    persistence_mode: bool | None = None

    @property
    def clock_reasons(self) -> list[str] | None:
        return reason_names(self.clock_reasons_mask)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["gpu"] = self.gpu.to_dict()
        d["clock_reasons"] = self.clock_reasons
        return d


@dataclass(frozen=True)
class DriverInfo:
    """The installed driver: its version string and the newest CUDA version it supports ("12.4")."""

    driver_version: str | None = None
    cuda_version: str | None = None


COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}  # nvmlComputeMode_t


def cuda_version_text(value: int | None) -> str | None:
    """NVML's integer CUDA version (12040) as "12.4". Source: nvmlSystemGetCudaDriverVersion docs
    (1000 * major + 10 * minor), the same encoding as cudaDriverGetVersion."""
    if not value:
        return None
    return f"{value // 1000}.{(value % 1000) // 10}"
