"""What PyTorch itself sees, read in a fresh Python process so that the caller never initialises CUDA
(after that, CUDA_VISIBLE_DEVICES could no longer change anything in it) and a broken CUDA stack can
only fail the child. The same approach as nvitop's `cuda_visible_devices` resolution in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field

from ..errors import GpuwiseError
from ..jsonl import read_json_file

# Runs in the child: prints one JSON object. CUDA's own complaint ("The NVIDIA driver on your system is
# too old", "no CUDA-capable device is detected") reaches Python only as a warning from is_available().
_SCRIPT = r"""
import json, warnings
out = {"installed": False}
try:
    import torch
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out)); raise SystemExit(0)
out.update(installed=True, version=torch.__version__, cuda=torch.version.cuda,
           hip=getattr(torch.version, "hip", None), devices=[], warnings=[])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        out["cuda_available"] = bool(torch.cuda.is_available())
        out["device_count"] = int(torch.cuda.device_count()) if out["cuda_available"] else 0
    except Exception as exc:
        out["cuda_available"], out["device_count"] = False, 0
        out["error"] = f"{type(exc).__name__}: {exc}"
out["warnings"] = [str(w.message).strip() for w in caught]
for i in range(out["device_count"]):
    try:
        p = torch.cuda.get_device_properties(i)
        out["devices"].append({"index": i, "name": p.name, "capability": [p.major, p.minor],
                               "memory_total_bytes": int(p.total_memory),
                               "uuid": str(getattr(p, "uuid", "") or "") or None,
                               "pci_bus_id": getattr(p, "pci_bus_id", None)})
    except Exception as exc:
        out.setdefault("error", f"cuda:{i}: {type(exc).__name__}: {exc}")
print(json.dumps(out))
"""


@dataclass(frozen=True)
class TorchFacts:
    """The torch build and what it sees. `cuda` is torch.version.cuda (None on a CPU-only build)."""

    installed: bool
    version: str | None = None
    cuda: str | None = None
    hip: str | None = None
    cuda_available: bool = False
    device_count: int = 0
    devices: tuple[dict, ...] = field(default_factory=tuple)  # {index, name, capability, memory_total_bytes, uuid, pci_bus_id}
    warnings: tuple[str, ...] = field(default_factory=tuple)
    error: str | None = None

    @property
    def cpu_only_build(self) -> bool:
        return self.installed and not self.cuda and not self.hip

    def to_dict(self) -> dict:
        return asdict(self)


FAKE_ENV = "GPUWISE_FAKE_TORCH"  # a JSON file with TorchFacts' fields: what PyTorch "sees" in CI next to fake GPUs


def probe(env: dict[str, str] | None = None, timeout_s: float = 120.0) -> TorchFacts:
    """Import torch in a child process (with `env`, default this process's) and report what it sees.
    With GPUWISE_FAKE_TORCH=path.json, that file's facts instead (pairs with GPUWISE_FAKE_GPUS)."""
    env = dict(os.environ) if env is None else env
    if env.get(FAKE_ENV):
        return _read_fake(env[FAKE_ENV])
    try:
        done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=timeout_s,
                              env=env)
    except subprocess.TimeoutExpired:
        return TorchFacts(installed=False, error=f"importing torch took longer than {timeout_s:.0f} s")
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return TorchFacts(installed=False, error=f"the torch probe exited with {done.returncode}: {tail}")
    return from_dict(json.loads(lines[-1]))


def from_dict(d: dict) -> TorchFacts:
    return TorchFacts(installed=bool(d.get("installed")), version=d.get("version"), cuda=d.get("cuda"), hip=d.get("hip"),
                      cuda_available=bool(d.get("cuda_available")), device_count=int(d.get("device_count") or 0),
                      devices=tuple(d.get("devices") or ()), warnings=tuple(d.get("warnings") or ()),
                      error=d.get("error"))


def _read_fake(path: str) -> TorchFacts:
    data = read_json_file(path, f"{FAKE_ENV}={path}")
    if not isinstance(data, dict):
        raise GpuwiseError(f"{FAKE_ENV}={path}: expected a JSON object such as "
                           '{"installed": true, "version": "2.13.0+cu130", "cuda": "13.0", "device_count": 1}')
    data.setdefault("installed", True)
    data.setdefault("cuda_available", bool(data.get("device_count")))
    return from_dict(data)
