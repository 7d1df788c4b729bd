"""Choosing GPUs: a pure ranking over snapshots, then `pick()` which reserves and sets the environment."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import CudaAlreadyInitialized, DeviceError, NoGpuError
from ..units import fmt_bytes, parse_bytes, parse_duration
from . import reserve
from .discover import discover
from .model import Gpu


def rank(gpus: list[Gpu]) -> list[Gpu]:
    """Best first: most free memory, then least utilisation, then lowest index."""
    return sorted(gpus, key=lambda g: (-g.memory_free_bytes, g.utilization_pct or 0.0, g.index))


def qualifies(gpu: Gpu, min_free_bytes: int, max_util_pct: float | None) -> bool:
    if gpu.memory_free_bytes < min_free_bytes:
        return False
    return max_util_pct is None or (gpu.utilization_pct or 0.0) <= max_util_pct


def visible_restriction(gpus: list[Gpu], value: str | None) -> list[Gpu]:
    """GPUs allowed by an already-set CUDA_VISIBLE_DEVICES (indices or UUID prefixes), e.g. from Slurm."""
    if value is None:
        return gpus
    allowed = []
    for token in (t.strip() for t in value.split(",")):
        if not token:
            continue
        match = [g for g in gpus if (token.isdigit() and g.index == int(token)) or
                 (not token.isdigit() and g.uuid.startswith(token))]
        if not match:
            break  # CUDA stops at the first invalid entry
        allowed += [g for g in match if g not in allowed]
    return allowed


def select(gpus: list[Gpu], *, count: int = 1, min_free_bytes: int = 0, max_util_pct: float | None = None,
           exclude_uuids: set[str] = frozenset()) -> list[Gpu]:
    """The `count` best qualifying GPUs, or fewer when not enough qualify (pure; no side effects)."""
    ok = [g for g in gpus if g.uuid not in exclude_uuids and qualifies(g, min_free_bytes, max_util_pct)]
    return rank(ok)[:count]


@dataclass
class Pick:
    devices: list[Gpu]
    cuda_visible_devices: str
    reservation: reserve.Reservation | None = None

    def to_dict(self) -> dict:
        return {
            "devices": [{"index": g.index, "uuid": g.uuid, "name": g.name, "memory_free_bytes": g.memory_free_bytes,
                         "memory_total_bytes": g.memory_total_bytes, "utilization_pct": g.utilization_pct}
                        for g in self.devices],
            "cuda_visible_devices": self.cuda_visible_devices,
        }

    def environment(self) -> dict[str, str]:
        return visible_devices_environment(self.cuda_visible_devices)

    def release(self) -> None:
        if self.reservation is not None:
            self.reservation.release()


def cuda_environment(devices: list[Gpu], use_uuid: bool = False) -> dict[str, str]:
    """The environment that makes CUDA see exactly `devices`, in this order (a pure function)."""
    return visible_devices_environment(",".join(g.uuid if use_uuid else str(g.index) for g in devices))


def visible_devices_environment(cuda_visible_devices: str) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES with PCI-bus ordering, so CUDA's numbering is nvidia-smi's (and NVML's)."""
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": cuda_visible_devices}


def check_cuda_not_initialized(env: dict[str, str]) -> None:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return
    if os.environ.get("CUDA_VISIBLE_DEVICES") != env["CUDA_VISIBLE_DEVICES"]:
        raise CudaAlreadyInitialized(
            "CUDA is already initialised in this process, so CUDA_VISIBLE_DEVICES can no longer change which "
            "GPUs it uses: call gpuwise.pick() before any CUDA call, or start the job with `gpuwise run`")


def _shortfall(gpus: list[Gpu], count: int, min_free: int, max_util: float | None, held: set[str]) -> str:
    want = f"{count} GPU(s)"
    conds = [f"≥ {fmt_bytes(min_free)} free"] if min_free else []
    if max_util is not None:
        conds.append(f"≤ {max_util:g}% utilisation")
    if conds:
        want += " with " + " and ".join(conds)
    ok = [g for g in gpus if qualifies(g, min_free, max_util)]
    free_ok = [g for g in ok if g.uuid not in held]
    parts = [f"{len(free_ok)} of {len(gpus)} qualify"]
    if len(ok) > len(free_ok):
        parts.append(f"{len(ok) - len(free_ok)} more are reserved by other gpuwise jobs")
    best = rank(gpus)[:1]
    if best:
        parts.append(f"most free: GPU {best[0].index} with {fmt_bytes(best[0].memory_free_bytes)}")
    return f"need {want}; " + ", ".join(parts)


def pick(count: int = 1, *, min_free: int | str = 0, max_util: float | None = None,
         wait: float | str | None = None, uuid: bool = False, reserve_for: str = "process",
         lease: float | str = 60.0, set_env: bool = True, poll_s: float = 2.0,
         on_wait: Callable[[str], None] | None = None, command: str = "") -> Pick:
    """Choose the `count` best GPUs now (or within `wait`), reserve them and set CUDA_VISIBLE_DEVICES.

    reserve_for: "process" holds them until this process exits (or `release()`), "lease" for `lease`
    seconds (for a shell that reads the printed value), "none" reserves nothing.
    """
    if count < 1:
        raise DeviceError(f"count must be at least 1, got {count}")
    min_free_bytes = parse_bytes(min_free)
    deadline = time.monotonic() + parse_duration(wait) if wait else None
    lease_s = parse_duration(lease)
    if reserve_for not in ("process", "lease", "none"):
        raise DeviceError(f"reserve_for must be process, lease or none, got {reserve_for!r}")
    while True:
        found = discover()
        gpus = visible_restriction(found.gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
        if not gpus:
            reason = found.reason or "CUDA_VISIBLE_DEVICES hides every GPU"
            raise NoGpuError(f"no GPU found ({reason}); `gpuwise doctor` says why")
        if count > len(gpus):
            raise DeviceError(f"asked for {count} GPUs but this machine has {len(gpus)}")
        with reserve.folder_lock() as folder:
            held = reserve.held_by_others(reserve.live_holders(folder))  # counted even with reserve_for="none"
            chosen = select(gpus, count=count, min_free_bytes=min_free_bytes, max_util_pct=max_util, exclude_uuids=held)
            if len(chosen) == count:
                env = cuda_environment(chosen, uuid)
                if set_env:
                    check_cuda_not_initialized(env)
                res = None
                if reserve_for != "none":
                    res = reserve.write_holders(
                        folder, [g.uuid for g in chosen], pid=os.getpid() if reserve_for == "process" else None,
                        lease_s=lease_s if reserve_for == "lease" else None, command=command)
                if set_env:
                    os.environ.update(env)
                return Pick(chosen, env["CUDA_VISIBLE_DEVICES"], res)
            message = _shortfall(gpus, count, min_free_bytes, max_util, held)
        if deadline is None:
            raise DeviceError(message)
        if time.monotonic() >= deadline:
            raise DeviceError(f"timed out waiting: {message}")
        if on_wait:
            on_wait(message)
        time.sleep(min(poll_s, max(deadline - time.monotonic(), 0.0)))
