"""The tuner end to end on the CPU: real child trials, kill + resume, the JSON contract, imagefolder."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from gpuwise.contracts import validate
from gpuwise.jsonl import read_lines as read_records
from gpuwise.measuring.child import run_isolated
from gpuwise.measuring.oom import FAKE_OOM_ENV

WORKLOAD = """
import pytest
import torch
from torch import nn
from torch.nn import functional as F


def model():
    return nn.Linear(8, 2)


def batch(n):
    g = torch.Generator().manual_seed(n)
    return torch.randn(n, 8, generator=g), torch.randint(0, 2, (n,), generator=g)


def loss(m, b):
    x, y = b
    return F.cross_entropy(m(x), y)
"""
DATASET = """

class Samples(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((8,), float(i)), i % 2


def dataset():
    return Samples()
"""

SETTINGS = {"batch_size", "num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "precision"}


HOLD_AT_16 = """

_batch = batch


def batch(n):  # the first run's batch-16 trial says it started, then waits to be killed with the tune
    import os, pathlib, time
    hold = os.environ.get("GPUWISE_TEST_HOLD")
    if n == 16 and hold:
        pathlib.Path(hold).touch()
        while True:
            time.sleep(1)
    return _batch(n)
"""


def test_killed_tune_resumes_without_repeating_a_finished_trial(tmp_path):
    wl = tmp_path / "job.py"
    wl.write_text(WORKLOAD + HOLD_AT_16)  # no dataset(): two compute trials (batch 8 is also the baseline, then 16)
    results = str(tmp_path / "trials.jsonl")
    held = tmp_path / "at16"
    # fp32 only: on a CPU with native bf16 the precision phase would add a bf16 trial at batch 8
    cmd = [sys.executable, "-m", "gpuwise", "tune", str(wl), "--results", results, "--budget", "10m",
           "--measure", "0.1s", "--batch-sizes", "8,16", "--precisions", "fp32"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "GPUWISE_TEST_HOLD": str(held)})
    try:
        # the batch-16 trial starts only after batch 8's record is written (and fsynced): wait for that
        # event, however slow the machine, not for a time; the guard only ends a hung run
        deadline = time.monotonic() + 300
        while not held.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert held.exists(), "the tune never reached its batch-16 trial"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the tuner and its trial child, mid-tune
        proc.wait()
    before = read_records(results)
    assert len(before) == 1 and before[0]["batch_size"] == 8, "killed after the first trial"

    out = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)  # exactly one JSON object on stdout
    after = read_records(results)
    assert after[:1] == before  # appended, never rewritten
    assert [r["batch_size"] for r in after] == [8, 16]  # batch 8 was not run again
    assert [(t["batch_size"], t["resumed"]) for t in result["trials"]] == [(8, True), (16, False)]
    assert result["resumed_trials"] == 1

    # the JSON contract (docs/contracts.md)
    assert SETTINGS | {"samples_per_s"} <= set(result["best"])
    assert SETTINGS | {"samples_per_s"} <= set(result["baseline"])
    assert result["baseline"]["batch_size"] == 8 and result["baseline"]["num_workers"] == 0
    assert result["baseline"]["pin_memory"] is False and result["baseline"]["samples_per_s"] > 0
    assert result["best"]["samples_per_s"] == result["limit_samples_per_s"] > 0  # no dataset: compute only
    for t in result["trials"]:
        assert SETTINGS | {"samples_per_s", "oom", "seconds"} <= set(t) and t["oom"] is False
    assert "batch_size=" in result["snippet"]
    validate("tune", result)


def test_train_trial_with_a_worker_on_a_workload_file(tmp_path):
    # the trial child is spawned; its DataLoader workers must still start the platform's way (fork on
    # Linux), or a workload file (not an importable module) cannot be pickled into them
    wl = tmp_path / "job_ds.py"
    wl.write_text(WORKLOAD + DATASET)
    res = run_isolated("gpuwise.tuning.trials:run_trial",
                       {"workload": str(wl), "kind": "train", "batch_size": 8, "num_workers": 1,
                        "persistent_workers": True, "measure_s": 0.1, "warmup_s": 0.0, "num_threads": 1},
                       timeout_s=120)
    assert res.status == "ok", res.traceback
    assert res.value["samples_per_s"] > 0 and res.value["num_threads"] == 1


def test_trial_oom_in_the_child_is_reported_not_raised():
    # GPUWISE_FAKE_OOM_ABOVE=8: a batch of 16 raises a real torch.OutOfMemoryError inside the trial child
    res = run_isolated("gpuwise.tuning.trials:run_trial",
                       {"workload": "examples:mlp", "kind": "fit", "batch_size": 16}, timeout_s=120,
                       env={FAKE_OOM_ENV: "8"})
    assert res.status == "oom", res.error
    assert "OutOfMemoryError" in res.error


def test_imagefolder_generates_decodes_and_augments(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUWISE_CACHE", str(tmp_path))
    monkeypatch.setenv("GPUWISE_IMAGEFOLDER_N", "20")
    from gpuwise.examples import imagefolder
    from gpuwise.workload import load_workload

    wl = load_workload("examples:imagefolder")
    ds = wl.build_dataset()
    root = imagefolder.ensure_images()
    assert os.listdir(tmp_path) == [os.path.basename(root)]  # renamed into place, no temporary left
    assert len(ds) == 20 and sum(len(os.listdir(os.path.join(root, d))) for d in os.listdir(root)) == 20
    stamp = os.path.getmtime(os.path.join(root, "class_0"))
    assert imagefolder.ensure_images() == root and os.path.getmtime(os.path.join(root, "class_0")) == stamp
    x, y = ds[3]
    assert x.shape == (3, imagefolder.CROP_SIZE, imagefolder.CROP_SIZE) and x.dtype == torch.float32
    path, label = ds.samples[3]
    assert y == label == int(os.path.basename(path)[:-4]) % 10  # image i belongs to class i % 10
    assert -3 < float(x.mean()) < 3 and float(x.std()) > 0.05  # normalised pixels, not a constant
    torch.manual_seed(0)
    a = ds[5][0]
    torch.manual_seed(1)
    assert not torch.equal(a, ds[5][0])  # random crop/flip: two reads of one image differ
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=0)
    xb, yb = next(iter(loader))
    assert xb.shape == (4, 3, 64, 64)
    loss = wl.compute_loss(wl.build_model(), (xb, yb))
    assert loss.ndim == 0 and torch.isfinite(loss)


def test_random_resized_crop_box_stays_inside_the_image():
    from gpuwise.examples.imagefolder import random_resized_crop_box

    torch.manual_seed(0)
    for _ in range(50):
        left, top, right, bottom = random_resized_crop_box(256, 200)
        assert 0 <= left < right <= 256 and 0 <= top < bottom <= 200
        assert (right - left) * (bottom - top) >= 0.08 * 256 * 200 * 0.9  # scale >= 0.08 (rounding)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tune_on_a_real_gpu(tmp_path):
    from gpuwise.tuning import tune

    res = tune("examples:mlp", budget_s=180, device="cuda", batch_sizes=[64, 128], measure_s=0.3,
               results=str(tmp_path / "r.jsonl"))
    assert res.best.samples_per_s > 0 and res.limit_samples_per_s > 0
    assert {"fp32", "tf32", "bf16", "fp16"} <= set(res.precisions)
    assert all(t.memory_kind == "cuda_allocated" for t in res.trials if t.status == "ok")
