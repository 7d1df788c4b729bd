"""The monitor's GPU code path on the CPU: torch.cuda's events and memory counters replaced by fakes,
the GPU sampled from a fake-GPU file. Checks the bookkeeping (events -> gpu_s / gpu_idle_s, peaks,
NVML-index mapping, precision detection), not CUDA itself: that is tests/test_monitor_gpu.py."""

from __future__ import annotations

import json

import pytest
import torch

import gpuwise
from gpuwise.monitoring.sampler import nvml_index_for


class FakeEvent:
    """A CUDA event whose 'GPU time' is a counter advanced by the test (milliseconds)."""

    clock_ms = 0.0

    def __init__(self, enable_timing: bool = False):
        self.t_ms = None

    def record(self, stream=None):
        self.t_ms = FakeEvent.clock_ms

    def query(self):
        return True

    def synchronize(self):
        pass

    def elapsed_time(self, other) -> float:
        return other.t_ms - self.t_ms


class Props:
    name, total_memory, major, minor = "NVIDIA A100-SXM4-40GB", 40 * 2**30, 8, 0


@pytest.fixture
def fake_cuda(monkeypatch, tmp_path):
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps([{"index": 1, "name": "NVIDIA A100-SXM4-40GB", "memory_total_mib": 40960,
                                 "memory_used_mib": 2048, "utilization_pct": 35}]))
    monkeypatch.setenv("GPUWISE_FAKE_GPUS", str(gpus))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # torch's cuda:0 is NVML's GPU 1
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # what CUDA_VISIBLE_DEVICES=1 leaves visible
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: Props())
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: 4 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d: 5 * 2**30)
    FakeEvent.clock_ms = 0.0
    return gpus


def test_gpu_path_bookkeeping(fake_cuda):
    assert nvml_index_for("cuda:0") == 1
    model = torch.nn.Linear(4, 2)
    hooks_before = len(torch.nn.modules.module._global_forward_pre_hooks)
    with gpuwise.monitor(device="cuda:0", interval_s=0.01) as mon:
        for _batch in mon.loader([torch.zeros(8, 4)] * 4):
            FakeEvent.clock_ms += 5.0   # the device works 5 ms per step ...
            model(torch.zeros(1, 4))    # the first forward tells the precision (no autocast: fp32)
        # ... and idles 0 ms between steps (the fake clock does not move while "loading")
    steps = mon.timeline.steps
    assert [s.gpu_s for s in steps] == [pytest.approx(0.005)] * 4
    assert [s.gpu_idle_s for s in steps] == [None] + [pytest.approx(0.0)] * 3
    assert all(s.memory_allocated_bytes == 3 * 2**30 for s in steps)
    s = mon.summary()
    assert s["device"] == "cuda:0" and s["capability"] == [8, 0] and s["precision"] == "fp32"
    assert s["memory"]["peak_reserved_bytes"] == 5 * 2**30 and s["memory"]["device_total_bytes"] == 40 * 2**30
    assert s["utilization"]["samples"] >= 1 and s["utilization"]["mean_pct"] == 35.0  # NVML GPU 1 via the fake file
    assert s["pinned_fraction"] == 0.0  # the CPU batches were not pinned
    kinds = [f["kind"] for f in s["findings"]]
    assert "precision" in kinds  # an A100 in fp32
    assert "low_memory_use" in kinds  # 5 GiB reserved of 40 GiB
    # the global forward pre-hook that detected the precision removed itself
    assert len(torch.nn.modules.module._global_forward_pre_hooks) == hooks_before


def test_every_step_gets_its_gpu_time_past_the_event_batch(fake_cuda):
    # events are resolved 16 at a time while the loop runs; the step being ended then must not be missed
    with gpuwise.monitor(device="cuda:0", sample=False) as mon:
        for _batch in mon.loader([torch.zeros(8, 4)] * 40):
            FakeEvent.clock_ms += 5.0
    assert [s.gpu_s for s in mon.timeline.steps] == [pytest.approx(0.005)] * 40
