"""GPU discovery, ranking and selection over fake GPUs, and the nvidia-smi CSV fallback parser."""

from __future__ import annotations

import pytest

from gpuwise import devices
from gpuwise.devices import smi
from gpuwise.devices.select import cuda_environment, rank, select, visible_restriction
from gpuwise.errors import CudaAlreadyInitialized, DeviceError
from gpuwise.units import GIB, MIB, parse_bytes


def test_fake_backend_reads_the_file(fake_gpus):
    found = devices.discover()
    assert found.backend == "fake"
    assert [g.index for g in found.gpus] == [0, 1, 2, 3]
    g0 = found.gpus[0]
    assert g0.memory_total_bytes == 40960 * MIB
    assert g0.memory_free_bytes == (40960 - 34000) * MIB
    assert g0.processes[0].user == "alice" and g0.processes[0].used_bytes == 33500 * MIB


def test_ranking_most_free_then_least_utilised(fake_gpus):
    gpus = devices.list_gpus()
    # free: gpu1 81916 MiB, gpu3 73920 MiB, gpu2 23032 MiB, gpu0 6960 MiB
    assert [g.index for g in rank(gpus)] == [1, 3, 2, 0]
    # 10 GiB = 10240 MiB excludes gpu0 (6960 MiB free); the best two remain 1 then 3
    assert [g.index for g in select(gpus, count=2, min_free_bytes=10 * GIB)] == [1, 3]
    # at most 20% utilisation excludes gpu3 (40%) and gpu0 (95%)
    assert [g.index for g in select(gpus, count=2, max_util_pct=20)] == [1, 2]


def test_equal_free_memory_prefers_lower_utilisation(write_fake):
    write_fake([
        {"index": 0, "name": "X", "memory_total_mib": 1000, "memory_used_mib": 0, "utilization_pct": 50},
        {"index": 1, "name": "X", "memory_total_mib": 1000, "memory_used_mib": 0, "utilization_pct": 5},
    ])
    assert [g.index for g in rank(devices.list_gpus())] == [1, 0]


def test_pick_sets_environment_and_reserves(fake_gpus, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    chosen = devices.pick(2, min_free="10GiB")
    try:
        assert [g.index for g in chosen.devices] == [1, 3]
        assert chosen.cuda_visible_devices == "1,3"
        import os

        assert os.environ["CUDA_VISIBLE_DEVICES"] == "1,3" and os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        # held by this process: a second pick gets the next best qualifying GPU, gpu2
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
        again = devices.pick(1, min_free="10GiB", set_env=False)
        assert [g.index for g in again.devices] == [2]
        again.release()
    finally:
        chosen.release()
    assert [g.index for g in devices.pick(2, min_free="10GiB", set_env=False).devices] == [1, 3]


def test_pick_uuid_mode(fake_gpus, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    chosen = devices.pick(1, uuid=True, set_env=False, reserve_for="none")
    assert chosen.cuda_visible_devices == "GPU-bbbbbbbb-1111-1111-1111-111111111111"


def test_pick_shortfall_message(fake_gpus, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(DeviceError, match=r"need 3 GPU\(s\) with ≥ 70 GiB free; 2 of 4 qualify"):
        devices.pick(3, min_free="70GiB", set_env=False)
    with pytest.raises(DeviceError, match="asked for 5 GPUs but this machine has 4"):
        devices.pick(5, set_env=False)


def test_pick_wait_times_out(fake_gpus, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    waits = []
    with pytest.raises(DeviceError, match="timed out waiting"):
        devices.pick(1, min_free="100GiB", wait="0.3s", poll_s=0.1, set_env=False, on_wait=waits.append)
    assert waits  # it polled at least once before giving up


def test_pick_wait_succeeds_when_a_gpu_frees(write_fake, monkeypatch):
    import threading

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    busy = [{"index": 0, "name": "X", "memory_total_mib": 1000, "memory_used_mib": 900}]
    path = write_fake(busy)
    timer = threading.Timer(0.3, lambda: path.write_text('[{"index": 0, "name": "X", "memory_total_mib": 1000, "memory_used_mib": 0}]'))
    timer.start()
    chosen = devices.pick(1, min_free="500MiB", wait="10s", poll_s=0.05, set_env=False, reserve_for="none")
    assert chosen.devices[0].index == 0


def test_existing_cuda_visible_devices_restricts_choice(fake_gpus):
    gpus = devices.list_gpus()
    assert [g.index for g in visible_restriction(gpus, "2,0")] == [2, 0]
    assert [g.index for g in visible_restriction(gpus, "GPU-dddd")] == [3]
    assert visible_restriction(gpus, "") == []
    assert [g.index for g in visible_restriction(gpus, "1,9,2")] == [1]  # CUDA stops at an invalid entry


def test_cuda_environment_is_pure(fake_gpus):
    gpus = devices.list_gpus()
    assert cuda_environment([gpus[3], gpus[1]]) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "3,1"}


def test_refuses_when_cuda_already_initialised(fake_gpus, monkeypatch):
    import torch

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(CudaAlreadyInitialized, match="already initialised"):
        devices.pick(1)


@pytest.mark.parametrize("text", ["banana", "10 parsecs", "", "-5GiB"])
def test_parse_bytes_rejects_nonsense(text):
    from gpuwise.errors import GpuwiseError

    with pytest.raises(GpuwiseError, match="cannot read"):
        parse_bytes(text)


def test_parse_bytes_units():
    assert parse_bytes("10GiB") == 10 * 1024**3
    assert parse_bytes("500MB") == 500 * 1000**2
    assert parse_bytes("1.5Ki") == 1536
    assert parse_bytes("42") == 42


@pytest.mark.parametrize("content, message", [
    ("[{", "not valid JSON"),
    ('{"index": 0}', "expected a JSON list"),
    ('[{"index": 0, "name": "X"}]', "missing field 'memory_total_mib'"),
    ('[{"index": 0, "name": "X", "memory_total_mib": 10, "memory_used_mib": 20}]', "must lie within"),
    ('[{"index": 0, "name": "X", "memory_total_mib": 10}, {"index": 0, "name": "Y", "memory_total_mib": 10}]', "duplicate"),
])
def test_malformed_fake_file(write_fake, content, message):
    write_fake(content)
    with pytest.raises(DeviceError, match=message):
        devices.discover()


# Recorded from `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` (fields in smi.GPU_FIELDS order).
SMI_GPUS = """\
0, GPU-6b3e1a62-1f0e-7d1b-9c55-0c0e3f4d2a11, NVIDIA H100 80GB HBM3, 81559, 75120, 97, 61, 512.33, 700.00, 00000000:18:00.0
1, GPU-0f2c9d84-93aa-42b6-8e3f-71d0b9a5c2e7, NVIDIA H100 80GB HBM3, 81559, 4, 0, 33, 71.02, 700.00, 00000000:2A:00.0
"""
SMI_APPS = """\
GPU-6b3e1a62-1f0e-7d1b-9c55-0c0e3f4d2a11, 31337, 75098, python
"""


def test_nvidia_smi_csv_parser():
    gpus = smi.parse_gpus(SMI_GPUS, SMI_APPS)
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].memory_total_bytes == 81559 * MIB and gpus[0].memory_used_bytes == 75120 * MIB
    assert gpus[0].utilization_pct == 97 and gpus[0].power_w == pytest.approx(512.33)
    assert gpus[0].processes[0].pid == 31337 and gpus[0].processes[0].used_bytes == 75098 * MIB
    assert gpus[1].processes == () and gpus[1].backend == "nvidia-smi"
    assert [g.index for g in rank(gpus)] == [1, 0]


def test_nvidia_smi_not_supported_fields():
    row = "0, GPU-x, Tesla T4, 15360, 0, [N/A], [N/A], [Not Supported], [N/A], 00000000:00:04.0\n"
    g = smi.parse_gpus(row)[0]
    assert g.utilization_pct is None and g.power_w is None and g.memory_free_bytes == 15360 * MIB


def test_no_gpu_falls_back_to_cpu(monkeypatch):
    monkeypatch.delenv("GPUWISE_FAKE_GPUS", raising=False)
    found = devices.discover()
    if found.gpus:
        pytest.skip("this machine has a GPU")
    assert found.backend in ("none", "nvml") and found.reason
    assert devices.host_devices()[0].kind == "cpu"
    assert str(devices.try_gpu(0)) == "cpu"
    assert [str(d) for d in devices.try_all_gpus()] == ["cpu"]


def test_fmt_bytes_three_significant_figures():
    from gpuwise.units import fmt_bytes

    # 1536 = 1.5 * 1024; at 100 and above no decimals; bytes stay whole
    assert [fmt_bytes(x) for x in (0, 1023, 1536, 100 * MIB, 1.5 * GIB)] == ["0 B", "1023 B", "1.5 KiB", "100 MiB", "1.5 GiB"]
