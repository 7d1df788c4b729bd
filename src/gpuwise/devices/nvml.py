"""The one seam to NVML (nvidia-ml-py's `pynvml`).

Every call goes through `query(fn, *args, default=None)`, which initialises NVML lazily and returns
`default` instead of raising when a function is missing or unsupported on this GPU (the approach of
nvitop's `libnvml.nvmlQuery`). `NvmlUnavailable` is raised only when NVML cannot start at all, so that
discovery can fall back to nvidia-smi or to the CPU.
"""

from __future__ import annotations

import threading
from typing import Any

from .health import COMPUTE_MODES, DriverInfo, GpuHealth, MigDevice, cuda_version_text
from .model import Gpu, GpuProcess

_lock = threading.Lock()
_state: dict[str, Any] = {"initialized": False, "error": None}


class NvmlUnavailable(Exception):
    """NVML could not be initialised: no library (no driver) or no usable device."""

    def __init__(self, reason: str, library_missing: bool):
        super().__init__(reason)
        self.library_missing = library_missing


def _pynvml():
    try:
        import pynvml
    except ImportError as exc:  # nvidia-ml-py not installed
        raise NvmlUnavailable("the nvidia-ml-py package is not installed", library_missing=True) from exc
    return pynvml


def init() -> Any:
    """Initialise NVML once per process; raise `NvmlUnavailable` with the reason when it cannot."""
    pynvml = _pynvml()
    with _lock:
        if _state["initialized"]:
            return pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            missing = isinstance(exc, getattr(pynvml, "NVMLError_LibraryNotFound", ())) or "not found" in str(exc).lower()
            raise NvmlUnavailable(f"NVML: {exc}", library_missing=missing) from exc
        _state["initialized"] = True
        return pynvml


def query(fn_name: str, *args, default=None):
    """Call `pynvml.<fn_name>(*args)`; return `default` when the call is unsupported or fails."""
    pynvml = init()
    fn = getattr(pynvml, fn_name, None)
    if fn is None:
        return default
    try:
        return fn(*args)
    except pynvml.NVMLError:
        return default


def _text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _processes(handle) -> tuple[GpuProcess, ...]:
    import psutil

    seen: dict[int, GpuProcess] = {}
    for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        for p in query(fn, handle, default=[]) or []:
            used = getattr(p, "usedGpuMemory", None)
            user = name = None
            try:
                proc = psutil.Process(p.pid)
                user, name = proc.username(), proc.name()
            except (psutil.Error, OSError):
                pass  # another container's process, or it just ended
            seen[p.pid] = GpuProcess(pid=p.pid, used_bytes=used if isinstance(used, int) else None, user=user, name=name)
    return tuple(seen.values())


def read_gpus() -> list[Gpu]:
    """Snapshot every GPU NVML sees, in NVML (PCI bus) order."""
    init()
    count = query("nvmlDeviceGetCount", default=0)
    gpus = []
    for i in range(count):
        h = query("nvmlDeviceGetHandleByIndex", i)
        if h is None:
            continue
        mem = query("nvmlDeviceGetMemoryInfo", h)
        util = query("nvmlDeviceGetUtilizationRates", h)
        power = query("nvmlDeviceGetPowerUsage", h)
        limit = query("nvmlDeviceGetEnforcedPowerLimit", h)
        pci = query("nvmlDeviceGetPciInfo", h)
        gpus.append(Gpu(
            index=i, uuid=_text(query("nvmlDeviceGetUUID", h, default=f"GPU-unknown-{i}")),
            name=_text(query("nvmlDeviceGetName", h, default="NVIDIA GPU")),
            memory_total_bytes=int(mem.total) if mem else 0, memory_used_bytes=int(mem.used) if mem else 0,
            utilization_pct=float(util.gpu) if util else None,
            temperature_c=query("nvmlDeviceGetTemperature", h, 0, default=None),  # 0 = NVML_TEMPERATURE_GPU
            power_w=power / 1000 if power is not None else None,  # NVML reports milliwatts
            power_limit_w=limit / 1000 if limit is not None else None,
            pci_bus_id=_text(getattr(pci, "busId", None)) if pci else None,
            processes=_processes(h), backend="nvml",
        ))
    return gpus


PCIE_THROUGHPUT_EVERY_S = 1.0  # nvmlDeviceGetPcieThroughput counts bytes over a 20 ms window (NVML docs): once a second
_pcie_last: dict[int, tuple[float, float | None]] = {}


def _pcie_rx(h, index: int) -> float | None:
    """Host->device bytes/s (NVML_PCIE_UTIL_RX_BYTES = 1, reported in KB/s), at most once per second."""
    import time

    now = time.monotonic()
    last = _pcie_last.get(index)
    if last is not None and now - last[0] < PCIE_THROUGHPUT_EVERY_S:
        return last[1]
    kb = query("nvmlDeviceGetPcieThroughput", h, 1)
    value = kb * 1000.0 if kb is not None else None
    _pcie_last[index] = (now, value)
    return value


def sample(index: int) -> dict[str, float | None]:
    """A cheap sample for monitors: utilisation, memory, power, clocks and why they are held down,
    temperature, and the PCIe link (generation, width, host->device bytes/s) of one GPU."""
    h = query("nvmlDeviceGetHandleByIndex", index)
    if h is None:
        return {}
    util = query("nvmlDeviceGetUtilizationRates", h)
    mem = query("nvmlDeviceGetMemoryInfo", h)
    power = query("nvmlDeviceGetPowerUsage", h)
    return {
        "utilization_pct": float(util.gpu) if util else None,
        "memory_util_pct": float(util.memory) if util else None,
        "memory_used_bytes": float(mem.used) if mem else None,
        "power_w": power / 1000 if power is not None else None,
        "sm_clock_mhz": query("nvmlDeviceGetClockInfo", h, 1, default=None),  # 1 = NVML_CLOCK_SM
        "sm_clock_max_mhz": query("nvmlDeviceGetMaxClockInfo", h, 1, default=None),
        "clock_reasons": _clock_reasons(h),  # NVML bitmask, names in devices.health.CLOCK_REASONS
        "temperature_c": query("nvmlDeviceGetTemperature", h, 0, default=None),
        "pcie_gen": query("nvmlDeviceGetCurrPcieLinkGeneration", h),
        "pcie_width": query("nvmlDeviceGetCurrPcieLinkWidth", h),
        "pcie_gen_max": query("nvmlDeviceGetMaxPcieLinkGeneration", h),
        "pcie_width_max": query("nvmlDeviceGetMaxPcieLinkWidth", h),
        "pcie_rx_bytes_per_s": _pcie_rx(h, index),
    }


def driver_info():
    """The driver version and the newest CUDA version it supports (`nvidia-smi`'s "CUDA Version")."""
    init()
    return DriverInfo(driver_version=_text(query("nvmlSystemGetDriverVersion")),
                      cuda_version=cuda_version_text(query("nvmlSystemGetCudaDriverVersion")))


def _clock_reasons(h) -> int | None:
    # nvmlDeviceGetCurrentClocksEventReasons replaced ...ThrottleReasons (same bits) in newer drivers
    value = query("nvmlDeviceGetCurrentClocksEventReasons", h)
    return value if value is not None else query("nvmlDeviceGetCurrentClocksThrottleReasons", h)


def _mig(h):
    mode = query("nvmlDeviceGetMigMode", h)  # (current, pending); 1 = enabled
    if mode is None:
        return None, ()
    enabled = bool(mode[0])
    if not enabled:
        return False, ()
    devices = []
    for i in range(query("nvmlDeviceGetMaxMigDeviceCount", h, default=0) or 0):
        m = query("nvmlDeviceGetMigDeviceHandleByIndex", h, i)
        if m is None:
            continue  # an empty slot: fewer instances than the maximum
        mem = query("nvmlDeviceGetMemoryInfo", m)
        devices.append(MigDevice(uuid=_text(query("nvmlDeviceGetUUID", m, default="MIG-unknown")),
                                 name=_text(query("nvmlDeviceGetName", m)), memory_total_bytes=int(mem.total) if mem else None))
    return True, tuple(devices)


def read_health() -> list:
    """A `GpuHealth` for every GPU NVML sees (what `gpuwise doctor` checks); unsupported fields are None."""
    out = []
    for gpu in read_gpus():
        h = query("nvmlDeviceGetHandleByIndex", gpu.index)
        if h is None:
            continue
        ecc = query("nvmlDeviceGetEccMode", h)  # (current, pending)
        pending = query("nvmlDeviceGetRetiredPagesPendingStatus", h)
        retired = [query("nvmlDeviceGetRetiredPages", h, cause) for cause in (0, 1)]  # multiple single-bit, double-bit
        mode = query("nvmlDeviceGetComputeMode", h)
        persistence = query("nvmlDeviceGetPersistenceMode", h)
        mig_enabled, mig_devices = _mig(h)
        out.append(GpuHealth(
            gpu=gpu,
            pcie_gen_current=query("nvmlDeviceGetCurrPcieLinkGeneration", h),
            pcie_gen_max=query("nvmlDeviceGetMaxPcieLinkGeneration", h),
            pcie_gen_gpu_max=query("nvmlDeviceGetGpuMaxPcieLinkGeneration", h),
            pcie_width_current=query("nvmlDeviceGetCurrPcieLinkWidth", h),
            pcie_width_max=query("nvmlDeviceGetMaxPcieLinkWidth", h),
            clock_reasons_mask=_clock_reasons(h),
            sm_clock_mhz=query("nvmlDeviceGetClockInfo", h, 1),  # 1 = NVML_CLOCK_SM
            sm_clock_max_mhz=query("nvmlDeviceGetMaxClockInfo", h, 1),
            temperature_slowdown_c=query("nvmlDeviceGetTemperatureThreshold", h, 1),  # NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
            temperature_shutdown_c=query("nvmlDeviceGetTemperatureThreshold", h, 0),  # ..._SHUTDOWN
            compute_mode=COMPUTE_MODES.get(mode) if mode is not None else None,
            mig_enabled=mig_enabled, mig_devices=mig_devices,
            ecc_enabled=bool(ecc[0]) if ecc else None,
            # NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1, NVML_VOLATILE_ECC = 0 (since the last driver load)
            ecc_uncorrected_volatile=query("nvmlDeviceGetTotalEccErrors", h, 1, 0) if ecc and ecc[0] else None,
            retired_pages=sum(len(r) for r in retired) if all(r is not None for r in retired) else None,
            retired_pages_pending=bool(pending) if pending is not None else None,
            persistence_mode=bool(persistence) if persistence is not None else None,
        ))
    return out
