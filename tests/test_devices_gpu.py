"""Real NVML, real CUDA: runs only where a GPU is present (marker `gpu`)."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

from gpuwise import devices


def _have_gpu() -> bool:
    try:
        return bool(devices.discover().gpus) and devices.discover().backend in ("nvml", "nvidia-smi")
    except Exception:
        return False


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _have_gpu(), reason="no real GPU (NVML) on this machine")]


def test_real_nvml_discovery(monkeypatch):
    monkeypatch.delenv("GPUWISE_FAKE_GPUS", raising=False)
    found = devices.discover()
    assert found.backend == "nvml"
    for g in found.gpus:
        assert g.memory_total_bytes > 0 and g.uuid.startswith("GPU-") and g.name


def test_real_pick_and_run_agree_with_torch(monkeypatch):
    monkeypatch.delenv("GPUWISE_FAKE_GPUS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    data = json.loads(run_cli("pick", "--json", "--no-reserve").stdout)
    uuid = data["devices"][0]["uuid"]
    code = "import torch; print(torch.cuda.device_count(), torch.cuda.get_device_properties(0).uuid)"
    proc = run_cli("run", "--", "python", "-c", code)
    assert proc.returncode == 0, proc.stderr
    count, torch_uuid = proc.stdout.split()
    assert count == "1" and uuid.endswith(torch_uuid) or torch_uuid in uuid
