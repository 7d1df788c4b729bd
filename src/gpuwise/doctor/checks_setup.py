"""Checks of the software path from PyTorch to the GPU: the torch build, the driver, NVML, the device
files, CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER, and what PyTorch finally sees. Each is a pure function
of `Facts` returning one `Check` with the evidence it used and the fix.
"""

from __future__ import annotations

import re
import sys

from ..devices.model import Gpu
from . import visible, wheels
from .facts import Facts
from .model import OK, PROBLEM, SKIPPED, WARNING, Check, Options, check

CONTAINER_FIX = ("start the container with the GPUs: `docker run --gpus all ...` (NVIDIA Container Toolkit), "
                 "Kubernetes `resources.limits: {nvidia.com/gpu: 1}`, or Slurm `--gres=gpu:1`")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _hardware(f: Facts) -> str:
    """A short account of the NVIDIA hardware signs, for evidence."""
    if f.health:
        return _plural(len(f.health), "NVIDIA GPU") + f" ({f.backend})"
    if f.pci_nvidia:
        return f"NVIDIA PCI device{'s' if len(f.pci_nvidia) > 1 else ''} {', '.join(f.pci_nvidia)}"
    nodes = [n for n in f.dev_nodes if n[len("nvidia"):].isdigit()]
    return ", ".join(f"/dev/{n}" for n in nodes)


def _version_tuple(text: str | None) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def _install_fix(f: Facts) -> str:
    version = f.torch.version if f.torch else None
    cmd, why = wheels.install_command(version, f.driver.cuda_version)
    if cmd is None:
        return f"upgrade the NVIDIA driver: {why}"
    extra = " (and torchvision/torchaudio from the same index, if you use them)"
    return f"{cmd}{extra} — {why}"


def _nvml_fix(reason: str, f: Facts) -> str:
    low = reason.lower()
    if "mismatch" in low:
        return ("the loaded kernel module and the driver's libraries differ (a driver upgrade without a reboot): reboot, "
                "or unload and reload the nvidia kernel modules")
    if f.in_container:
        return CONTAINER_FIX
    return "install the NVIDIA driver (e.g. `sudo ubuntu-drivers install`, or the distribution's nvidia-driver package) and reboot"


@check("nvml")
def nvml_library(f: Facts, o: Options) -> Check:
    s = f.nvml
    if f.backend == "fake":
        return Check("nvml", OK, "fake GPUs from GPUWISE_FAKE_GPUS: NVML is not consulted")
    if s.available:
        return Check("nvml", OK, f"NVML loaded: driver {f.driver.driver_version or '?'}, {_plural(len(f.health), 'GPU')}")
    if s.package_missing:
        return Check("nvml", WARNING, f"{s.reason}: gpuwise falls back to nvidia-smi "
                     f"({'found ' + _plural(len(f.health), 'GPU') if f.health else f.discovery_reason or 'nothing found'})",
                     "pip install nvidia-ml-py")
    if f.nvidia_hardware:
        return Check("nvml", PROBLEM, f"{s.reason}, yet this machine has {_hardware(f)}: the NVIDIA driver is not "
                     f"{'mounted into this container' if f.in_container else 'installed or not loaded'}", _nvml_fix(s.reason, f))
    if s.library_missing:
        return Check("nvml", OK, f"{s.reason} (libnvidia-ml.so ships with the NVIDIA driver); no NVIDIA device on the "
                     "PCI bus or in /dev: this machine has no NVIDIA GPU, so there is no driver to load")
    return Check("nvml", PROBLEM, s.reason, _nvml_fix(s.reason, f))


@check("device_files")
def device_files(f: Facts, o: Options) -> Check:
    gpu_nodes = sorted((n for n in f.dev_nodes if n[len("nvidia"):].isdigit()), key=lambda n: int(n[len("nvidia"):]))
    others = [n for n in f.dev_nodes if n not in gpu_nodes]
    first_last = f"/dev/{gpu_nodes[0]}" + (f" ... /dev/{gpu_nodes[-1]}" if len(gpu_nodes) > 1 else "") if gpu_nodes else ""
    listed = ", ".join([f"{first_last} ({_plural(len(gpu_nodes), 'GPU node')})"] + [f"/dev/{n}" for n in others])
    where = " inside a container" if f.in_container else ""
    if not gpu_nodes:
        if f.health or f.pci_nvidia:
            return Check("device_files", PROBLEM, f"no /dev/nvidia* device files{where}, yet {_hardware(f)}: CUDA "
                         "cannot open a GPU without them", CONTAINER_FIX if f.in_container else
                         "load the driver so it creates them: `sudo nvidia-modprobe` (or `sudo modprobe nvidia`), then "
                         "`nvidia-smi`")
        nv = f.env.get("NVIDIA_VISIBLE_DEVICES")
        hint = f" (NVIDIA_VISIBLE_DEVICES={nv!r})" if nv is not None else ""
        if f.in_container:
            return Check("device_files", OK, f"no /dev/nvidia*{where}{hint} and no NVIDIA PCI device visible: no GPU "
                         "was given to this container", f"if the host has GPUs: {CONTAINER_FIX}")
        return Check("device_files", OK, "no /dev/nvidia* and no NVIDIA PCI device: no NVIDIA GPU in this machine")
    missing = [n for n in ("nvidiactl", "nvidia-uvm") if n not in f.dev_nodes]
    if missing:
        return Check("device_files", PROBLEM, f"{listed}{where}, but no {', '.join('/dev/' + m for m in missing)}: "
                     "CUDA needs /dev/nvidiactl and /dev/nvidia-uvm to start",
                     "`sudo nvidia-modprobe -u -c=0` creates the UVM nodes (in a container: pass them, or use --gpus)")
    return Check("device_files", OK, f"{listed}{where}")


@check("pytorch_build")
def pytorch_build(f: Facts, o: Options) -> Check:
    t = f.torch
    if t is None:
        return Check("pytorch_build", SKIPPED, "PyTorch was not probed")
    if not t.installed:
        return Check("pytorch_build", PROBLEM, f"PyTorch cannot be imported by {sys.executable}: {t.error}",
                     _install_fix(f) if f.nvidia_hardware else "pip install torch")
    if t.hip:
        return Check("pytorch_build", OK, f"torch {t.version} is a ROCm (HIP {t.hip}) build: gpuwise's NVIDIA checks "
                     "do not apply to AMD GPUs")
    if t.cpu_only_build:
        if f.nvidia_hardware:
            return Check("pytorch_build", PROBLEM, f"torch {t.version} is a CPU-only build (torch.version.cuda is None) "
                         f"but this machine has {_hardware(f)}: PyTorch cannot use them", _install_fix(f))
        return Check("pytorch_build", OK, f"torch {t.version} is a CPU-only build (torch.version.cuda is None); "
                     "there is no NVIDIA GPU here, so a CPU job loses nothing",
                     f"only on a machine with an NVIDIA GPU: {_install_fix(f)}")
    return Check("pytorch_build", OK, f"torch {t.version} was built with CUDA {t.cuda}")


@check("driver_cuda")
def driver_cuda(f: Facts, o: Options) -> Check:
    t = f.torch
    if t is None or not t.installed or not t.cuda:
        return Check("driver_cuda", SKIPPED, "no CUDA build of PyTorch to compare with the driver")
    too_old = [w for w in t.warnings if "too old" in w.lower()]
    have, need = _version_tuple(f.driver.cuda_version), _version_tuple(t.cuda)
    drv = f"driver {f.driver.driver_version or '?'} supports CUDA {f.driver.cuda_version}"
    built = f"torch {t.version} was built with CUDA {t.cuda}"
    if too_old:
        return Check("driver_cuda", PROBLEM, f"{built}; CUDA says: {too_old[0]}", _install_fix(f))
    if have is None or need is None:
        return Check("driver_cuda", SKIPPED, f"{built}; the driver's CUDA version is unknown "
                     f"({f.nvml.reason or 'not reported by ' + f.backend})")
    if have[0] < need[0]:
        floor = wheels.MIN_DRIVER_FOR_MAJOR.get(need[0])
        return Check("driver_cuda", PROBLEM, f"{drv}, older than the CUDA {t.cuda} runtime {built.split(' was')[0]} uses: "
                     "CUDA cannot start", f"upgrade the driver (>= {floor} for CUDA {need[0]}.x), or " + _install_fix(f))
    if have < need:
        return Check("driver_cuda", WARNING, f"{drv}, older than CUDA {t.cuda} of {t.version}: it runs through CUDA "
                     "minor-version compatibility, but kernels shipped only as PTX, and features of the newer CUDA, fail",
                     f"upgrade the driver to one for CUDA {t.cuda}, or {_install_fix(f)}")
    return Check("driver_cuda", OK, f"{drv}; {built}")


def _describe(rows: list[visible.MappingRow], which: str) -> str:
    parts = []
    for r in rows:
        g = r.pci_bus_id_order if which == "pci" else r.fastest_first_order
        parts.append(f"cuda:{r.cuda_index} = GPU {g.index} ({g.name.removeprefix('NVIDIA ')})" if g else f"cuda:{r.cuda_index} = ?")
    return ", ".join(parts)


@check("cuda_visible_devices")
def cuda_visible_devices(f: Facts, o: Options) -> Check:
    value = f.env.get("CUDA_VISIBLE_DEVICES")
    gpus = f.gpus
    if value is None:
        return Check("cuda_visible_devices", OK, f"unset: CUDA shows all {_plural(len(gpus), 'GPU')}" if gpus else
                     "unset")
    # Without a GPU list, parse against 64 placeholders: the syntax (repeats, mixing) can still be judged.
    against = gpus or [Gpu(index=i, uuid=f"?{i}", name="?", memory_total_bytes=0, memory_used_bytes=0) for i in range(64)]
    parsed = visible.parse(value, against, f.env.get("CUDA_DEVICE_ORDER"))
    real_problems = parsed.problems if gpus else [p for p in parsed.problems if "no GPU's UUID" not in p]
    if parsed.kind == "empty":
        status = WARNING if f.nvidia_hardware else OK
        return Check("cuda_visible_devices", status, parsed.problems[0] + (" (fine for a CPU job)" if gpus else ""),
                     "unset it (`unset CUDA_VISIBLE_DEVICES`) or name GPUs so that a failed pick stops the shell: "
                     "`gpus=$(gpuwise pick) && export CUDA_VISIBLE_DEVICES=$gpus` (an `export X=$(gpuwise pick)` "
                     "that fails leaves exactly this empty value)"
                     if status == WARNING else "")
    if real_problems:  # on a machine without NVIDIA GPUs a broken value costs a CPU job nothing
        return Check("cuda_visible_devices", PROBLEM if f.nvidia_hardware else WARNING,
                     f"CUDA_VISIBLE_DEVICES={value!r}: " + "; ".join(real_problems),
                     "use only indices (as nvidia-smi numbers them, with CUDA_DEVICE_ORDER=PCI_BUS_ID) or only "
                     "full GPU-/MIG- UUIDs, each once: `gpuwise pick -n N` prints a valid value")
    if not gpus:
        return Check("cuda_visible_devices", SKIPPED, f"CUDA_VISIBLE_DEVICES={value!r}; no GPU list to check the "
                     f"entries against ({f.discovery_reason or f.nvml.reason})")
    shown = ", ".join(f"cuda:{k} = GPU {g.index}" for k, g in enumerate(parsed.visible))
    return Check("cuda_visible_devices", OK, f"CUDA_VISIBLE_DEVICES={value!r}: {shown or 'MIG instances'}")


def measured_order(f: Facts) -> list[Gpu | None] | None:
    """The GPU behind each cuda:k as PyTorch reported it (UUID, else PCI bus number), or None if unknown."""
    t = f.torch
    if t is None or not t.devices:
        return None
    out: list[Gpu | None] = []
    for d in t.devices:
        uuid, bus = str(d.get("uuid") or ""), d.get("pci_bus_id")
        match = [g for g in f.gpus if uuid and g.uuid.removeprefix("GPU-") == uuid.removeprefix("GPU-")]
        if not match and isinstance(bus, int):
            match = [g for g in f.gpus if g.pci_bus_id and int(g.pci_bus_id.split(":")[-2], 16) == bus]
        out.append(match[0] if len(match) == 1 else None)
    return out if any(out) else None


@check("cuda_device_order")
def cuda_device_order(f: Facts, o: Options) -> Check:
    order = f.env.get("CUDA_DEVICE_ORDER")
    value = f.env.get("CUDA_VISIBLE_DEVICES")
    gpus = f.gpus
    if len(gpus) < 2:
        return Check("cuda_device_order", SKIPPED, "fewer than two GPUs: the numbering cannot differ")
    if value is not None and not value.strip():
        return Check("cuda_device_order", SKIPPED, "CUDA_VISIBLE_DEVICES hides every GPU")
    rows = visible.mapping(value, gpus)
    if not rows:
        return Check("cuda_device_order", SKIPPED, f"CUDA_VISIBLE_DEVICES={value!r} names no whole GPU to map "
                     "(MIG instances, or an invalid first entry)")
    details = {"mapping": [r.to_dict() for r in rows], "cuda_device_order": order,
               "assumption": "FASTEST_FIRST ranks by compute capability (higher first), PCI order among equals"}
    measured = measured_order(f)
    if measured:
        details["measured"] = [None if g is None else g.index for g in measured]
    uses_uuids = value is not None and value.strip().startswith(("GPU-", "MIG-"))
    if order == "PCI_BUS_ID" or uses_uuids:
        why = "UUIDs name GPUs whatever the order" if uses_uuids and order != "PCI_BUS_ID" else "CUDA_DEVICE_ORDER=PCI_BUS_ID"
        return Check("cuda_device_order", OK, f"{why}: {_describe(rows, 'pci')} (nvidia-smi's numbering)", "", details)
    bad_value = order is not None and order != "FASTEST_FIRST"
    same = all(r.pci_bus_id_order == r.fastest_first_order for r in rows)
    if measured:  # PyTorch's own answer replaces the guess
        rows = [visible.MappingRow(r.cuda_index, r.token, r.pci_bus_id_order, measured[r.cuda_index]
                                   if r.cuda_index < len(measured) else None) for r in rows]
        details["mapping"] = [r.to_dict() for r in rows]
        same = all(r.pci_bus_id_order == r.fastest_first_order for r in rows)
    now = f"CUDA_DEVICE_ORDER={order!r} (not a valid value: CUDA uses FASTEST_FIRST)" if bad_value else \
        ("CUDA_DEVICE_ORDER unset (CUDA's default FASTEST_FIRST)" if order is None else "CUDA_DEVICE_ORDER=FASTEST_FIRST")
    fix = "export CUDA_DEVICE_ORDER=PCI_BUS_ID (then indices mean what nvidia-smi shows; `gpuwise pick`/`run` set it)"
    if same:
        return Check("cuda_device_order", WARNING if bad_value else OK,
                     f"{now}; " + ("PyTorch reports the same numbering as nvidia-smi: " if measured else
                                   "the GPUs rank equally, so CUDA's numbering is nvidia-smi's in practice: ") +
                     f"{_describe(rows, 'pci')}", fix, details)
    return Check("cuda_device_order", WARNING,
                 f"{now}: CUDA numbers the fastest GPU first, so {'the indices in CUDA_VISIBLE_DEVICES' if value else 'cuda:N'} "
                 f"are not nvidia-smi's. Now{' (measured in PyTorch)' if measured else ''}: {_describe(rows, 'fast')}; "
                 f"with PCI_BUS_ID: {_describe(rows, 'pci')}",
                 fix, details)


@check("pytorch_sees_gpus")
def pytorch_sees_gpus(f: Facts, o: Options) -> Check:
    t = f.torch
    if t is None:
        return Check("pytorch_sees_gpus", SKIPPED, "PyTorch was not probed")
    if t.device_count > 0:
        names = ", ".join(f"cuda:{d['index']} {d['name']}" for d in t.devices) or f"{t.device_count} device(s)"
        value = f.env.get("CUDA_VISIBLE_DEVICES")
        expected = len(visible.parse(value, f.gpus).visible) if f.gpus else 0
        if expected > t.device_count and not (value or "").strip().startswith("MIG-"):
            return Check("pytorch_sees_gpus", WARNING, f"torch.cuda.device_count() = {t.device_count} ({names}) but "
                         f"{_plural(expected, 'GPU')} should be visible" + (f" with CUDA_VISIBLE_DEVICES={value!r}" if value
                                                                           else ""),
                         "see the checks above (MIG, compute mode, CUDA_VISIBLE_DEVICES); `nvidia-smi` for failed GPUs")
        return Check("pytorch_sees_gpus", OK, f"torch.cuda.device_count() = {t.device_count}: {names}")
    said = "; ".join(list(t.warnings) + ([t.error] if t.error else []))
    evidence = f"torch.cuda.is_available() is False{': ' + said if said else ''}"
    if not (f.nvidia_hardware or o.expect_gpu):
        return Check("pytorch_sees_gpus", OK, f"{evidence}; no NVIDIA GPU here: PyTorch uses the CPU")
    why = "a GPU was expected (--expect-gpu) and PyTorch sees none" if not f.nvidia_hardware else \
        f"this machine has {_hardware(f)} but PyTorch sees none"
    return Check("pytorch_sees_gpus", PROBLEM, f"{why}; {evidence}",
                 "fix the first problem above (they are listed in the order CUDA needs them)")
