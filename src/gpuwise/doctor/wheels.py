"""The exact `pip install` for a CUDA build of PyTorch that runs on this driver.

PyTorch publishes one wheel index per CUDA variant, https://download.pytorch.org/whl/cuXYZ (cu118,
cu121, cu124, cu126, cu128, cu129, cu130, cu132, ...); which variants a release has is PyTorch's
"Release Compatibility Matrix" (pytorch/pytorch RELEASE.md, stable and experimental CUDA columns), copied
below. A wheel built with CUDA X.Y needs a driver whose CUDA version (nvidia-smi's "CUDA Version") is at
least X.Y for full support; within one major version CUDA's minor-version compatibility lets an older
driver of the same major run it with limits (NVIDIA, "CUDA Compatibility", minor version compatibility),
so gpuwise recommends the newest variant not newer than the driver.
"""

from __future__ import annotations

import re

INDEX_URL = "https://download.pytorch.org/whl/{variant}"

# torch minor -> CUDA versions with wheels (RELEASE.md, Release Compatibility Matrix, stable + experimental).
WHEEL_CUDA = {
    (2, 4): ("11.8", "12.1", "12.4"),
    (2, 5): ("11.8", "12.1", "12.4"),
    (2, 6): ("11.8", "12.4", "12.6"),
    (2, 7): ("11.8", "12.6", "12.8"),
    (2, 8): ("12.6", "12.8", "12.9"),
    (2, 9): ("12.6", "12.8", "13.0"),
    (2, 10): ("12.6", "12.8", "13.0"),
    (2, 11): ("12.6", "12.8", "13.0"),
    (2, 12): ("12.6", "13.0", "13.2"),
    (2, 13): ("12.6", "13.0", "13.2"),
    (2, 14): ("12.6", "13.0", "13.2"),
}

# Oldest driver for each CUDA major (minor-version compatibility). Source: NVIDIA CUDA Toolkit Release
# Notes, Table "CUDA Toolkit and Minimum Required Driver Version for CUDA Minor Version Compatibility".
MIN_DRIVER_FOR_MAJOR = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}


def _version(text: str | None) -> tuple[int, ...] | None:
    m = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def variant(cuda: str) -> str:
    """"12.6" -> "cu126"."""
    major, minor = _version(cuda) or (0, 0)
    return f"cu{major}{minor}"


def install_command(torch_version: str | None, driver_cuda: str | None) -> tuple[str | None, str]:
    """(the `pip install` command line, why this one); (None, why) when no PyTorch wheel fits the driver.

    In order: the installed torch release's newest CUDA build not newer than the driver; else its build
    of the driver's CUDA major (minor-version compatibility); else the newest older release that has a
    fitting build; else none (upgrade the driver).
    """
    driver = _version(driver_cuda)
    tv = _version(torch_version)
    known = tv in WHEEL_CUDA
    row = WHEEL_CUDA[tv] if known else WHEEL_CUDA[max(WHEEL_CUDA)]
    release = f"torch {tv[0]}.{tv[1]}" if known else "the newest torch release gpuwise knows"
    base = re.match(r"\d+\.\d+\.\d+", torch_version or "")
    # The index's wheels carry a local label (torch-2.9.0+cu128-...): pinning it replaces an installed +cpu
    # build, which a bare `torch==2.9.0` would count as already satisfied.
    pin = (lambda cuda: f"torch=={base.group(0)}+{variant(cuda)}") if known and base else (lambda cuda: "--force-reinstall torch")
    if driver is None:
        others = ", ".join(variant(c) for c in row[:-1])
        return (_line(pin(row[-1]), row[-1]), f"for a driver whose \"CUDA Version\" (nvidia-smi) is {row[-1]} or newer; "
                f"{release} also has {others}: take the newest not above the driver's")
    fits = [c for c in row if _version(c) <= driver]
    if fits:
        return _line(pin(fits[-1]), fits[-1]), f"the newest CUDA build of {release} not newer than the driver's CUDA {driver_cuda}"
    same_major = [c for c in row if _version(c)[0] == driver[0]]
    if same_major:
        return (_line(pin(same_major[0]), same_major[0]),
                f"{release} has no build for CUDA <= {driver_cuda}; its CUDA {same_major[0]} build runs on this driver "
                f"through CUDA minor-version compatibility (driver >= {MIN_DRIVER_FOR_MAJOR.get(driver[0], '?')}), "
                "or upgrade the driver for full support")
    for compatible in (lambda c: _version(c) <= driver, lambda c: _version(c)[0] == driver[0]):
        for minor in sorted(WHEEL_CUDA, reverse=True):
            older = [c for c in WHEEL_CUDA[minor] if compatible(c)]
            if older:
                spec = f"'torch>={minor[0]}.{minor[1]},<{minor[0]}.{minor[1] + 1}'"
                return (_line(spec, older[-1] if _version(older[-1]) <= driver else older[0]),
                        f"no build of {release} runs on a driver for CUDA {driver_cuda}: torch {minor[0]}.{minor[1]} "
                        "is the newest release with one (or upgrade the driver)")
    return None, f"no PyTorch release gpuwise knows has a build for CUDA {driver_cuda}: upgrade the driver"


def _line(spec: str, cuda: str) -> str:
    return f"pip install {spec} --index-url {INDEX_URL.format(variant=variant(cuda))}"
