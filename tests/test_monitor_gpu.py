"""gpuwise.monitor on a real CUDA GPU: CUDA-event timing, NVML samples, precision detection (skipped without one)."""

from __future__ import annotations

import time

import pytest
import torch

import gpuwise

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


class SlowDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(0.004)  # 4 samples per batch: >= 16 ms of "reading" against < 1 ms of GPU work
        return torch.randn(512), i % 10


def _loop(loader, autocast: bool = False):
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gpuwise.monitor(device="cuda:0", interval_s=0.02) as mon:
        for x, y in mon.loader(loader):
            x, y = mon.to_device((x, y))
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            loss.item()
    return mon


def test_data_bound_on_gpu():
    mon = _loop(torch.utils.data.DataLoader(SlowDataset(), batch_size=4))
    s = mon.summary()
    assert "data_starvation" in [f["kind"] for f in s["findings"]]
    assert all(st.gpu_s is not None for st in mon.timeline.steps)
    assert s["utilization"]["samples"] > 0  # NVML answered for the GPU in use
    assert s["memory"]["peak_allocated_bytes"] > 0 and s["precision"] in ("fp32", "tf32")


def test_compute_bound_and_autocast_detected_on_gpu():
    # batches made ahead: a DataLoader collating 64 samples in this process takes longer than this model's
    # step on an H100 (which watch rightly called data starvation there), a list of ready batches does not
    batches = [(torch.randn(64, 512), torch.randint(0, 10, (64,))) for _ in range(16)]
    mon = _loop(batches, autocast=True)
    s = mon.summary()
    assert s["precision"] == "bf16"
    assert "data_starvation" not in [f["kind"] for f in s["findings"]]
    assert "precision" not in [f["kind"] for f in s["findings"]]
