"""Fake GPUs (docs/contracts.md contract): `GPUWISE_FAKE_GPUS=path.json` replaces NVML everywhere.

The file is a JSON list of {"index", "uuid", "name", "memory_total_mib", "memory_used_mib",
"utilization_pct", "processes": [{"pid", "user", "used_mib"}]}. It is re-read on every query, so a
test (or a user's CI) can change it between calls to simulate load. Optional health fields (PCIe link,
clock reasons, temperature thresholds, compute mode, MIG, ECC, persistence, driver) feed
`gpuwise doctor` (`read_fake_health`); absent means "not reported" (docs/contracts.md, fake-GPU contract).
"""

from __future__ import annotations

import os

from ..errors import DeviceError
from ..jsonl import read_json_file
from ..units import MIB
from .health import COMPUTE_MODES, DriverInfo, GpuHealth, MigDevice, reason_mask
from .model import Gpu, GpuProcess

ENV = "GPUWISE_FAKE_GPUS"


def fake_path() -> str | None:
    return os.environ.get(ENV) or None


def _load(path: str) -> list:
    data = read_json_file(path, f"{ENV}={path}", DeviceError)
    if not isinstance(data, list):
        raise DeviceError(f"{ENV}={path}: expected a JSON list of GPUs, got {type(data).__name__}")
    return data


def _parse(path: str, parse_entry) -> list:
    out = []
    for i, entry in enumerate(_load(path)):
        try:
            out.append(parse_entry(entry))
        except (KeyError, TypeError, ValueError) as exc:
            what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise DeviceError(f"{ENV}={path}: GPU entry {i} is malformed: {what}") from exc
    return out


def read_fake_gpus(path: str) -> list[Gpu]:
    gpus = _parse(path, _gpu)
    indices = [g.index for g in gpus]
    if len(set(indices)) != len(indices):
        raise DeviceError(f"{ENV}={path}: duplicate GPU index in {indices}")
    return sorted(gpus, key=lambda g: g.index)


def _gpu(entry: dict) -> Gpu:
    if not isinstance(entry, dict):
        raise TypeError(f"expected an object, got {type(entry).__name__}")
    total = int(entry["memory_total_mib"]) * MIB
    used = int(entry.get("memory_used_mib", 0)) * MIB
    if total <= 0 or used < 0 or used > total:
        raise ValueError(f"memory_used_mib={entry.get('memory_used_mib')} must lie within 0..memory_total_mib={entry['memory_total_mib']}")
    index = int(entry["index"])
    procs = tuple(
        GpuProcess(pid=int(p["pid"]), used_bytes=int(p.get("used_mib", 0)) * MIB, user=p.get("user"), name=p.get("name"))
        for p in entry.get("processes", [])
    )
    util = entry.get("utilization_pct")
    return Gpu(
        index=index, uuid=str(entry.get("uuid") or f"GPU-fake-{index:04d}"), name=str(entry["name"]),
        memory_total_bytes=total, memory_used_bytes=used,
        utilization_pct=None if util is None else float(util),
        temperature_c=entry.get("temperature_c"), power_w=entry.get("power_w"),
        pci_bus_id=entry.get("pci_bus_id"), processes=procs, backend="fake",
    )


def read_fake_health(path: str) -> list[GpuHealth]:
    """`GpuHealth` for every fake GPU: the optional health fields, None where the file leaves them out."""
    gpus = {g.index: g for g in read_fake_gpus(path)}  # validates the base fields and duplicates
    return sorted(_parse(path, lambda e: _health(e, gpus[int(e["index"])])), key=lambda h: h.gpu.index)


def fake_driver_info(path: str) -> DriverInfo:
    """The first entry's "driver_version" / "cuda_driver_version" (the driver is one per machine)."""
    data = _load(path)
    first = data[0] if data and isinstance(data[0], dict) else {}
    version = first.get("driver_version")
    cuda = first.get("cuda_driver_version")
    return DriverInfo(None if version is None else str(version), None if cuda is None else str(cuda))


def _opt(entry: dict, key: str, kind):
    value = entry.get(key)
    if value is None:
        return None
    if kind is bool and not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {value!r}")
    return kind(value)


def _health(entry: dict, gpu: Gpu) -> GpuHealth:
    reasons = entry.get("clock_reasons")
    if reasons is not None and not isinstance(reasons, (list, int)):
        raise ValueError(f"clock_reasons must be a list of names or an NVML bitmask, got {reasons!r}")
    mode = entry.get("compute_mode")
    if mode is not None and mode not in COMPUTE_MODES.values():
        raise ValueError(f"compute_mode must be one of {sorted(COMPUTE_MODES.values())}, got {mode!r}")
    mig = tuple(MigDevice(uuid=str(m["uuid"]), name=m.get("name"),
                          memory_total_bytes=int(m["memory_total_mib"]) * MIB if m.get("memory_total_mib") else None)
                for m in entry.get("mig_devices") or [])
    return GpuHealth(
        gpu=gpu,
        pcie_gen_current=_opt(entry, "pcie_gen_current", int), pcie_gen_max=_opt(entry, "pcie_gen_max", int),
        pcie_gen_gpu_max=_opt(entry, "pcie_gen_gpu_max", int),
        pcie_width_current=_opt(entry, "pcie_width_current", int), pcie_width_max=_opt(entry, "pcie_width_max", int),
        clock_reasons_mask=reasons if isinstance(reasons, int) or reasons is None else reason_mask(reasons),
        sm_clock_mhz=_opt(entry, "sm_clock_mhz", float), sm_clock_max_mhz=_opt(entry, "sm_clock_max_mhz", float),
        temperature_slowdown_c=_opt(entry, "temperature_slowdown_c", float),
        temperature_shutdown_c=_opt(entry, "temperature_shutdown_c", float),
        compute_mode=mode, mig_enabled=_opt(entry, "mig_enabled", bool), mig_devices=mig,
        ecc_enabled=_opt(entry, "ecc_enabled", bool),
        ecc_uncorrected_volatile=_opt(entry, "ecc_uncorrected_volatile", int),
        retired_pages=_opt(entry, "retired_pages", int),
        retired_pages_pending=_opt(entry, "retired_pages_pending", bool),
        persistence_mode=_opt(entry, "persistence_mode", bool),
    )


def sample_fields(h: GpuHealth) -> dict:
    """The health keys of a monitor sample (`devices.nvml.sample`) from a fake GPU's optional fields."""
    return {"sm_clock_mhz": h.sm_clock_mhz, "sm_clock_max_mhz": h.sm_clock_max_mhz, "clock_reasons": h.clock_reasons_mask,
            "temperature_c": h.gpu.temperature_c, "pcie_gen": h.pcie_gen_current, "pcie_width": h.pcie_width_current,
            "pcie_gen_max": h.pcie_gen_max, "pcie_width_max": h.pcie_width_max, "pcie_rx_bytes_per_s": None}
