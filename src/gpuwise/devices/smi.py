"""Fallback discovery through `nvidia-smi --query-gpu=... --format=csv` when NVML's library is missing
(nvidia-smi ships with the driver and can work where the Python binding cannot load it)."""

from __future__ import annotations

import csv
import io
import shutil
import subprocess

from ..units import MIB
from .model import Gpu, GpuProcess

GPU_FIELDS = ("index", "uuid", "name", "memory.total", "memory.used", "utilization.gpu",
              "temperature.gpu", "power.draw", "power.limit", "pci.bus_id")
APP_FIELDS = ("gpu_uuid", "pid", "used_memory", "process_name")


def available() -> bool:
    return shutil.which("nvidia-smi") is not None


def _run(args: list[str]) -> str:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=20, check=True).stdout


def _num(text: str) -> float | None:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def parse_gpus(gpu_csv: str, apps_csv: str = "") -> list[Gpu]:
    """Parse `--format=csv,noheader,nounits` output of the two queries (pure, tested on recorded text)."""
    procs: dict[str, list[GpuProcess]] = {}
    for row in csv.reader(io.StringIO(apps_csv)):
        if len(row) >= 3 and row[1].strip().isdigit():
            used = _num(row[2])
            name = row[3].strip() if len(row) > 3 else None
            procs.setdefault(row[0].strip(), []).append(
                GpuProcess(pid=int(row[1]), used_bytes=int(used * MIB) if used is not None else None, name=name))
    gpus = []
    for row in csv.reader(io.StringIO(gpu_csv)):
        if len(row) < len(GPU_FIELDS):
            continue
        f = dict(zip(GPU_FIELDS, (c.strip() for c in row)))
        gpus.append(Gpu(
            index=int(f["index"]), uuid=f["uuid"], name=f["name"],
            memory_total_bytes=int((_num(f["memory.total"]) or 0) * MIB),
            memory_used_bytes=int((_num(f["memory.used"]) or 0) * MIB),
            utilization_pct=_num(f["utilization.gpu"]), temperature_c=_num(f["temperature.gpu"]),
            power_w=_num(f["power.draw"]), power_limit_w=_num(f["power.limit"]), pci_bus_id=f["pci.bus_id"],
            processes=tuple(procs.get(f["uuid"], [])), backend="nvidia-smi",
        ))
    return gpus


def read_gpus() -> list[Gpu]:
    fmt = "--format=csv,noheader,nounits"
    gpu_csv = _run([f"--query-gpu={','.join(GPU_FIELDS)}", fmt])
    try:
        apps_csv = _run([f"--query-compute-apps={','.join(APP_FIELDS)}", fmt])
    except (subprocess.SubprocessError, OSError):
        apps_csv = ""
    return parse_gpus(gpu_csv, apps_csv)
