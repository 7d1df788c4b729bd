"""Everything the doctor's checks read, gathered once: the only impure part of the doctor.

The checks are pure functions of `Facts`, so tests build a `Facts` (or call `gather` with a fake /dev,
a fake PCI tree, a crafted environment and a canned torch probe) instead of needing a GPU.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from ..devices import fake, nvml
from ..devices.discover import discover
from ..devices.health import DriverInfo, GpuHealth
from .torch_probe import TorchFacts, probe

ENV_VARS = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES")
NVIDIA_PCI_VENDOR = "0x10de"  # PCI-SIG vendor id of NVIDIA (pci-ids.ucw.cz)


@dataclass(frozen=True)
class NvmlStatus:
    available: bool
    reason: str = ""               # why not, in NVML's words
    library_missing: bool = False  # libnvidia-ml.so (the driver) or the nvidia-ml-py package is missing
    package_missing: bool = False  # the nvidia-ml-py package itself


@dataclass(frozen=True)
class Facts:
    """The machine as the doctor saw it. `backend`: fake | nvml | nvidia-smi | none."""

    env: dict[str, str] = field(default_factory=dict)
    dev_nodes: tuple[str, ...] = ()            # names under /dev starting with "nvidia"
    pci_nvidia: tuple[str, ...] = ()           # PCI addresses of NVIDIA display/3D controllers
    in_container: bool = False
    nvml: NvmlStatus = NvmlStatus(False, "not checked")
    backend: str = "none"
    discovery_reason: str = ""
    health: tuple[GpuHealth, ...] = ()         # one per GPU found, NVML index order
    driver: DriverInfo = DriverInfo()
    torch: TorchFacts | None = None            # None: the probe was not run
    process_states: dict[int, str] = field(default_factory=dict)  # pid -> running | zombie | absent
    platform: str = sys.platform

    @property
    def gpus(self):
        return [h.gpu for h in self.health]

    @property
    def nvidia_hardware(self) -> bool:
        """Any sign of an NVIDIA GPU: found by a backend, a device node, or a PCI function."""
        return bool(self.health or self.pci_nvidia or any(n[len("nvidia"):].isdigit() for n in self.dev_nodes))


def list_dev_nodes(dev_dir: str | None = None) -> tuple[str, ...]:
    try:
        return tuple(sorted(n for n in os.listdir(dev_dir or "/dev") if n.startswith("nvidia")))
    except OSError:
        return ()


def list_nvidia_pci(pci_dir: str | None = None) -> tuple[str, ...]:
    """NVIDIA functions of PCI class 0x03 (display: VGA 0x0300, 3D controller 0x0302): the GPUs the
    kernel sees whether or not a driver is loaded (what `lspci -d 10de:` lists)."""
    found = []
    try:
        pci_dir = pci_dir or "/sys/bus/pci/devices"
        entries = sorted(os.listdir(pci_dir))
    except OSError:
        return ()
    for addr in entries:
        try:
            with open(os.path.join(pci_dir, addr, "vendor")) as fh:
                vendor = fh.read().strip()
            with open(os.path.join(pci_dir, addr, "class")) as fh:
                klass = fh.read().strip()
        except OSError:
            continue
        if vendor.lower() == NVIDIA_PCI_VENDOR and klass.lower().startswith("0x03"):
            found.append(addr)
    return tuple(found)


def in_container(root: str = "/") -> bool:
    """Docker (/.dockerenv), Podman (/run/.containerenv) or a container cgroup (docker, kubepods, containerd)."""
    if os.path.exists(os.path.join(root, ".dockerenv")) or os.path.exists(os.path.join(root, "run/.containerenv")):
        return True
    try:
        with open(os.path.join(root, "proc/1/cgroup")) as fh:
            text = fh.read()
    except OSError:
        return False
    return any(k in text for k in ("docker", "kubepods", "containerd", "libpod"))


def nvml_status() -> NvmlStatus:
    try:
        nvml.init()
    except nvml.NvmlUnavailable as exc:
        return NvmlStatus(False, str(exc), exc.library_missing, "nvidia-ml-py" in str(exc))
    return NvmlStatus(True)


def process_states(pids) -> dict[int, str]:
    import psutil

    out = {}
    for pid in pids:
        try:
            out[pid] = "zombie" if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE else "running"
        except psutil.NoSuchProcess:
            out[pid] = "absent"
        except (psutil.Error, OSError):
            out[pid] = "unknown"
    return out


def _health_and_driver(status: NvmlStatus) -> tuple[str, str, tuple[GpuHealth, ...], DriverInfo]:
    path = fake.fake_path()
    if path:
        return "fake", "", tuple(fake.read_fake_health(path)), fake.fake_driver_info(path)
    if status.available:
        health = tuple(nvml.read_health())
        return "nvml", "" if health else "NVML reports no GPU", health, nvml.driver_info()
    found = discover()  # the nvidia-smi fallback, when only NVML's Python package is missing
    return found.backend, found.reason, tuple(GpuHealth(gpu=g) for g in found.gpus), DriverInfo()


def _fake_device_layer(health: tuple[GpuHealth, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Fake GPUs come with the device files and PCI functions a healthy driver would create."""
    nodes = tuple(sorted({f"nvidia{h.gpu.index}" for h in health} | {"nvidiactl", "nvidia-uvm"}))
    return nodes, tuple(h.gpu.pci_bus_id or f"0000:{h.gpu.index:02x}:00.0" for h in health)


def gather(*, env: dict[str, str] | None = None, dev_dir: str | None = None, pci_dir: str | None = None,
           container_root: str = "/", torch_probe: Callable[[dict[str, str]], TorchFacts] | None = probe) -> Facts:
    """Look at this machine. `torch_probe=None` skips PyTorch (a few seconds: it imports torch in a child).

    `dev_dir`/`pci_dir` default to /dev and /sys/bus/pci/devices; with fake GPUs (GPUWISE_FAKE_GPUS) and
    no directory given, the device layer of a healthy driver is assumed for them.
    """
    env = dict(os.environ if env is None else env)
    is_fake = bool(fake.fake_path())
    status = NvmlStatus(True, "fake GPUs (GPUWISE_FAKE_GPUS)") if is_fake else nvml_status()
    backend, reason, health, driver = _health_and_driver(status)
    fake_nodes, fake_pci = _fake_device_layer(health) if is_fake else ((), ())
    nodes = list_dev_nodes(dev_dir) if dev_dir or not is_fake else fake_nodes
    pci = list_nvidia_pci(pci_dir) if pci_dir or not is_fake else fake_pci
    pids = {p.pid for h in health for p in h.gpu.processes}
    return Facts(
        env={k: env[k] for k in ENV_VARS if k in env}, dev_nodes=nodes,
        pci_nvidia=pci, in_container=in_container(container_root), nvml=status,
        backend=backend, discovery_reason=reason, health=health, driver=driver,
        torch=torch_probe(env) if torch_probe is not None else None, process_states=process_states(sorted(pids)),
    )
