"""Fake GPUs (DESIGN.md contract): `GPUWISE_FAKE_GPUS=path.json` replaces NVML everywhere.

The file is a JSON list of {"index", "uuid", "name", "memory_total_mib", "memory_used_mib",
"utilization_pct", "processes": [{"pid", "user", "used_mib"}]}. It is re-read on every query, so a
test (or a user's CI) can change it between calls to simulate load.
"""

from __future__ import annotations

import json
import os

from ..errors import DeviceError
from ..units import MIB
from .model import Gpu, GpuProcess

ENV = "GPUWISE_FAKE_GPUS"


def fake_path() -> str | None:
    return os.environ.get(ENV) or None


def read_fake_gpus(path: str) -> list[Gpu]:
    try:
        with open(path) as fh:
            data = json.load(fh)
    except OSError as exc:
        raise DeviceError(f"{ENV}={path}: cannot read the file ({exc.strerror})") from exc
    except json.JSONDecodeError as exc:
        raise DeviceError(f"{ENV}={path}: not valid JSON (line {exc.lineno}: {exc.msg})") from exc
    if not isinstance(data, list):
        raise DeviceError(f"{ENV}={path}: expected a JSON list of GPUs, got {type(data).__name__}")
    gpus = []
    for i, entry in enumerate(data):
        try:
            gpus.append(_gpu(entry))
        except (KeyError, TypeError, ValueError) as exc:
            what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise DeviceError(f"{ENV}={path}: GPU entry {i} is malformed: {what}") from exc
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
