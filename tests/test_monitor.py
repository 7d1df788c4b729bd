"""gpuwise.monitor on the CPU: data-bound vs compute-bound loops, the summary contract, rank files, HTML."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

import gpuwise
from gpuwise.integrations import merged_summary
from gpuwise.monitoring import Monitor, read_timeline
from gpuwise.monitoring.sampler import Sampler, fake_sample
from gpuwise.monitoring.timeline import Timeline, rank_file

DATA = os.path.join(os.path.dirname(__file__), "data")


class SlowDataset(torch.utils.data.Dataset):
    """Each sample takes 5 ms to 'decode': a batch of 4 waits >= 20 ms, the step's compute is ~1 ms."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        time.sleep(0.005)
        return torch.randn(16), torch.tensor(i % 4)


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: OpenMP spinning on 2 shared cores makes tiny steps take 50 ms at random."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _train(loader, model, mon, heavy: bool = False):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = torch.randn(256, 256)
    for x, y in mon.loader(loader):
        x, y = mon.to_device((x, y))
        if heavy:  # ~20 matmuls of 256x256: milliseconds of compute against microseconds of loading
            for _ in range(20):
                w = torch.tanh(w @ w) * 0.5
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()


def test_data_bound_loop_is_diagnosed_as_data_starvation():
    loader = torch.utils.data.DataLoader(SlowDataset(), batch_size=4)
    with gpuwise.monitor(device="cpu", interval_s=0.05) as mon:
        _train(loader, torch.nn.Linear(16, 4), mon)
    s = mon.summary()
    assert s["steps"] == 10  # 40 samples / 4 per batch
    # sums are noisy on a shared CI CPU (a descheduled step); the medians are not: >= 20 ms vs ~1 ms
    assert s["data_wait_fraction"] > 0.3
    assert s["split"]["data_wait_s"]["median"] > 5 * s["split"]["compute_s"]["median"]
    kinds = [f["kind"] for f in s["findings"]]
    assert "data_starvation" in kinds and "compute_bound" not in kinds
    starving = next(f for f in s["findings"] if f["kind"] == "data_starvation")
    assert "num_workers=" in starving["fix"] and "waits for the next batch" in starving["evidence"]
    assert s["loader"]["num_workers"] == 0 and s["batch_size"] == 4


def test_compute_bound_loop_is_diagnosed_differently(tmp_path):
    ds = torch.utils.data.TensorDataset(torch.randn(24, 16), torch.randint(0, 4, (24,)))
    loader = torch.utils.data.DataLoader(ds, batch_size=4)
    with gpuwise.monitor(device="cpu", interval_s=0.05, report=str(tmp_path / "r.html")) as mon:
        _train(loader, torch.nn.Linear(16, 4), mon, heavy=True)
    s = mon.summary()
    assert s["steps"] == 6
    assert s["compute_fraction"] > 0.8 and s["data_wait_fraction"] < 0.15
    kinds = [f["kind"] for f in s["findings"]]
    assert kinds == ["compute_bound"]
    assert "compute_bound" in (tmp_path / "r.html").read_text()  # report= writes the HTML on exit


def test_summary_follows_the_json_contract():
    with gpuwise.monitor(device="cpu", sample=False) as mon:
        for _ in range(4):
            with mon.phase("compute"):
                time.sleep(0.002)
            mon.step()
    s = json.loads(json.dumps(mon.summary()))
    for key in ("steps", "step_time_s", "data_wait_fraction", "copy_fraction", "compute_fraction", "findings"):
        assert key in s
    assert isinstance(s["step_time_s"]["median"], float)
    assert s["steps"] == 4
    total = s["data_wait_fraction"] + s["copy_fraction"] + s["compute_fraction"]
    assert total == pytest.approx(1.0)
    for f in s["findings"]:
        assert set(f) >= {"kind", "evidence", "fix"}


def test_explicit_phases_split_the_step():
    # compute wrapped, data not: the unwrapped rest of each step is counted as data wait.
    with gpuwise.monitor(device="cpu", sample=False) as mon:
        for _ in range(5):
            time.sleep(0.006)      # "loading"
            with mon.phase("compute"):
                time.sleep(0.002)
            mon.step()
    st = mon.timeline.steps[2]
    assert st.data_s > st.compute_s > 0
    assert st.data_s + st.copy_s + st.compute_s == pytest.approx(st.total_s)
    with pytest.raises(ValueError):
        with mon.phase("forward"):
            pass


def test_rank_files_merge_into_one_report_with_rank_imbalance(tmp_path):
    # rank 1's steps take 3x rank 0's: 3 ms vs 9 ms of compute.
    for rank, sleep_s in ((0, 0.003), (1, 0.009)):
        with Monitor(device="cpu", out_dir=str(tmp_path), rank=rank, sample=False) as mon:
            for _ in range(5):
                with mon.phase("compute"):
                    time.sleep(sleep_s)
                mon.step()
    assert len(read_timeline(rank_file(str(tmp_path), 1)).steps) == 5
    s = merged_summary(str(tmp_path), report=str(tmp_path / "ddp.html"))
    assert [r["rank"] for r in s["ranks"]] == [0, 1]
    imbalance = next(f for f in s["findings"] if f["kind"] == "rank_imbalance")
    assert "rank 1" in imbalance["fix"]
    assert (tmp_path / "ddp.html").read_text().count("<tr><td>") == 2


def test_crashed_rank_file_is_still_readable(tmp_path):
    path = rank_file(str(tmp_path), 0)
    with Monitor(device="cpu", out_dir=str(tmp_path), sample=False) as mon:
        for _ in range(3):
            mon.step()
    with open(path, "a") as fh:
        fh.write('{"type": "step", "step": 9, "start_')  # a write cut off by a crash
    assert len(read_timeline(path).steps) == 3


def test_sampler_reads_fake_gpus(monkeypatch):
    monkeypatch.setenv("GPUWISE_FAKE_GPUS", os.path.join(DATA, "four_gpus.json"))
    tl = Timeline()
    sampler = Sampler(tl, gpu_indices=[0, 3], gpu_source=fake_sample)
    sampler.sample_once()
    assert tl.samples[0].gpus[0]["utilization_pct"] == 95 and tl.samples[0].gpus[3]["utilization_pct"] == 40
    assert tl.samples[0].gpus[3]["memory_used_bytes"] == 8000 * 2**20  # memory_used_mib in the file
    assert tl.samples[0].rss_bytes > 0


def test_monitor_without_nvml_says_it_samples_cpu_only():
    with gpuwise.monitor(device="cpu", interval_s=0.02) as mon:
        time.sleep(0.06)
    assert mon.timeline.samples and all(not s.gpus for s in mon.timeline.samples)
    assert any("CPU and RAM only" in n for n in mon.summary()["notes"])


def test_html_report_escapes_user_strings(tmp_path):
    from gpuwise.report.html import render_html

    tl = Timeline(meta={"command": ["python", "train.py", "<script>alert(1)</script>"], "device": "cpu",
                        "device_name": "<b>cpu</b>"}, notes=["<img src=x onerror=alert(2)>"])
    s = gpuwise.monitoring.summarize(tl)
    s["findings"] = [{"kind": "data_starvation", "evidence": "<script>x</script>", "fix": "a & b"}]
    page = render_html(tl, s)
    assert "<script>" not in page and "<img src=x" not in page and "<b>cpu" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "a &amp; b" in page
    assert "data:image/png;base64," in page


def test_lightning_callback_duck_typed(tmp_path):
    from gpuwise.integrations.lightning import GpuwiseMonitor, lightning_precision

    class Trainer:  # the attributes the callback reads from lightning's Trainer
        global_rank, world_size, precision = 0, 1, "bf16-mixed"
        train_dataloader = torch.utils.data.DataLoader(list(range(8)), batch_size=2, num_workers=0)

    class Module:
        device = torch.device("cpu")

    cb = GpuwiseMonitor(report=str(tmp_path / "pl.html"), print_summary=False)
    trainer, module = Trainer(), Module()
    cb.on_train_start(trainer, module)
    for i in range(4):
        time.sleep(0.004)  # fetching the batch
        cb.on_train_batch_start(trainer, module, torch.zeros(2, 3), i)
        time.sleep(0.001)  # training_step
        cb.on_train_batch_end(trainer, module, None, torch.zeros(2, 3), i)
    cb.on_train_end(trainer, module)
    assert cb.result["steps"] == 4 and cb.result["precision"] == "bf16"
    assert cb.result["data_wait_fraction"] > cb.result["compute_fraction"]
    assert (tmp_path / "pl.html").exists()
    assert lightning_precision("16-mixed") == "fp16" and lightning_precision("bf16-true") == "bf16-pure"


def test_lightning_validation_is_not_counted_as_data_wait():
    from gpuwise.integrations.lightning import GpuwiseMonitor

    class Trainer:
        global_rank, world_size, precision = 0, 1, "32-true"

    class Module:
        device = torch.device("cpu")

    cb = GpuwiseMonitor(print_summary=False)
    trainer, module = Trainer(), Module()
    cb.on_train_start(trainer, module)
    for _epoch in range(2):
        for i in range(4):
            cb.on_train_batch_start(trainer, module, torch.zeros(2, 3), i)  # batches arrive at once
            time.sleep(0.005)  # training_step
            cb.on_train_batch_end(trainer, module, None, torch.zeros(2, 3), i)
        cb.on_validation_start(trainer, module)
        time.sleep(0.2)  # the validation loop: 0.2 s against 8 x 5 ms of training
    cb.on_train_end(trainer, module)
    # without leaving validation out, epoch 2's first step would wait 0.2 s "for data": ~80% of the time
    assert cb.result["steps"] == 8
    assert cb.result["data_wait_fraction"] < 0.15
    assert "data_starvation" not in [f["kind"] for f in cb.result["findings"]]


def test_successive_monitors_in_one_process_keep_their_files(tmp_path):
    # one monitor per epoch: 3 + 4 steps in two files of rank 0, merged on one clock
    for steps in (3, 4):
        with Monitor(device="cpu", out_dir=str(tmp_path), rank=0, sample=False) as mon:
            for _ in range(steps):
                with mon.phase("compute"):
                    time.sleep(0.001)
                mon.step()
    assert sorted(os.listdir(tmp_path)) == ["monitor-rank0.1.jsonl", "monitor-rank0.jsonl"]
    tl = gpuwise.monitoring.merge_rank_files(str(tmp_path))
    assert len(tl.steps) == 7
    starts = [s.start_s for s in tl.steps]
    assert starts == sorted(starts)  # the second epoch's steps come after the first's


def test_rank_comes_from_the_rank_env(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    with Monitor(device="cpu", out_dir=str(tmp_path), sample=False) as mon:
        mon.step()
    assert os.listdir(tmp_path) == ["monitor-rank3.jsonl"] and mon.timeline.steps[0].rank == 3
