"""`gpuwise doctor` on real NVML and a real CUDA build: runs only where a GPU is present (marker `gpu`)."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

from gpuwise import devices
from gpuwise.devices import nvml


def _have_gpu() -> bool:
    try:
        found = devices.discover()
        return bool(found.gpus) and found.backend == "nvml"
    except Exception:
        return False


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _have_gpu(), reason="no real GPU (NVML) on this machine")]


def test_real_health_fields_are_reported(monkeypatch):
    monkeypatch.delenv("GPUWISE_FAKE_GPUS", raising=False)
    health = nvml.read_health()
    assert health
    for h in health:  # every data-center GPU reports these; None here means a query name or argument is wrong
        assert h.pcie_gen_current and h.pcie_gen_max and h.pcie_width_current and h.pcie_width_max
        assert h.clock_reasons_mask is not None and h.temperature_slowdown_c and h.compute_mode
        assert h.persistence_mode is not None and h.mig_enabled is not None
    info = nvml.driver_info()
    assert info.driver_version and info.cuda_version and info.cuda_version[0].isdigit()
    s = nvml.sample(health[0].gpu.index)
    assert s["pcie_gen"] and s["pcie_width"] and s["clock_reasons"] is not None


def test_real_doctor_sees_the_gpu(monkeypatch):
    monkeypatch.delenv("GPUWISE_FAKE_GPUS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    done = run_cli("doctor", "--json", "--expect-gpu")
    out = json.loads(done.stdout)
    by = {c["name"]: c for c in out["checks"]}
    assert out["gpu_usable"] is True, by["pytorch_sees_gpus"]
    assert by["pytorch_build"]["status"] == "ok" and by["driver_cuda"]["status"] in ("ok", "warning")
    assert by["device_files"]["status"] == "ok" and by["nvml"]["status"] == "ok"
    assert done.returncode in (0, 3)  # 3 only when a real health problem is present; never 4 here
    # PyTorch's own numbering (UUID / PCI bus) was matched to NVML for every device
    if len(devices.discover().gpus) > 1:
        assert None not in by["cuda_device_order"]["details"].get("measured", [None])
