"""Which GPUs are there: fake file, else NVML, else nvidia-smi CSV; plus the CPU (and MPS) as devices."""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass, field

from . import fake, nvml, smi
from .model import Gpu, HostDevice


@dataclass(frozen=True)
class Discovery:
    """The GPUs found, which backend found them, and why none were found when that is the case."""

    gpus: list[Gpu] = field(default_factory=list)
    backend: str = "none"  # fake | nvml | nvidia-smi | none
    reason: str = ""       # empty when GPUs were found

    def to_dict(self) -> dict:
        return {"backend": self.backend, "reason": self.reason, "gpus": [g.to_dict() for g in self.gpus]}


def discover() -> Discovery:
    """Snapshot all GPUs. Never raises for a machine without GPUs; raises DeviceError for a bad fake file."""
    path = fake.fake_path()
    if path:
        return Discovery(fake.read_fake_gpus(path), "fake")
    try:
        gpus = nvml.read_gpus()
        return Discovery(gpus, "nvml", "" if gpus else "NVML reports no GPU")
    except nvml.NvmlUnavailable as exc:
        nvml_reason = str(exc)
        if exc.library_missing and smi.available():
            try:
                gpus = smi.read_gpus()
                return Discovery(gpus, "nvidia-smi", "" if gpus else "nvidia-smi reports no GPU")
            except (subprocess.SubprocessError, OSError) as smi_exc:
                return Discovery([], "none", f"{nvml_reason}; nvidia-smi failed: {smi_exc}")
        return Discovery([], "none", nvml_reason)


def list_gpus() -> list[Gpu]:
    return discover().gpus


def host_devices() -> list[HostDevice]:
    """The CPU, and Apple's MPS where torch has it (checked only if torch is already imported or cheap)."""
    import psutil

    vm = psutil.virtual_memory()
    devices = [HostDevice("cpu", _cpu_name(), os.cpu_count(), vm.total, vm.available)]
    if platform.system() == "Darwin":
        try:
            import torch

            if torch.backends.mps.is_available():
                devices.append(HostDevice("mps", "Apple MPS", None, vm.total, vm.available))
        except ImportError:
            pass
    return devices


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"
