"""`gpuwise.measure` and `gpuwise measure` on the CPU: the same child-process path as on a GPU."""

from __future__ import annotations

import gc
import json
import multiprocessing

import psutil
import pytest
from conftest import run_cli

import gpuwise
from gpuwise.cli import main
from gpuwise.contracts import validate
from gpuwise.errors import GpuwiseError
from gpuwise.measuring import Measurement, measure
from gpuwise.truth import TRUTH_FIELDS

# examples:mlp is Linear(32, 16): parameters 32*16*4 + 16*4 = 2,112 B; batch 8: x 8*32*4 = 1,024 B
# and y 8*8 = 64 B (int64). With SGD nothing else lives between steps: 2,112 + 1,088 = 3,200 B.
MLP_PARAMS_BYTES, MLP_BATCH8_BYTES = 2112, 1088

BIG_WORKLOAD = '''
import torch
def model():
    return torch.nn.Linear(8192, 8192)   # 8192*8192*4 B = 256 MiB of weights, built in the child only
def batch(n):
    return torch.randn(n, 8192)
def loss(model, batch):
    return model(batch).square().mean()
'''


def test_cli_measure_mlp_on_cpu_json():
    proc = run_cli("measure", "examples:mlp", "--batch-size", "8", "--device", "cpu", "--json", "--steps", "3")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)  # exactly one JSON object on stdout
    validate("measure", d)
    assert d["workload"] == "examples:mlp" and d["batch_size"] == 8 and d["device"] == "cpu"
    assert d["oom"] is False and d["optimizer"] == "adamw" and d["precision"] == "fp32"
    assert len(d["step_times_s"]) == 3 and d["step_time_s"] > 0
    assert d["samples_per_s"] == pytest.approx(8 / d["step_time_s"])
    # AdamW keeps exp_avg and exp_avg_sq (2 * 2,112 B) and a 4-byte step per parameter tensor (2 * 4 B);
    # the gradients (2,112 B) are alive during the optimizer step on top of that.
    at_least = MLP_PARAMS_BYTES * 4 + 2 * 4 + MLP_BATCH8_BYTES
    assert at_least <= d["peak_allocated_bytes"] < 2 * at_least
    assert d["peak_method"] == "plan.cpu_truth"


def test_measure_api_sgd_peak_and_truth_record():
    m = gpuwise.measure("examples:mlp", 8, optimizer="sgd", steps=2, warmup=1, device="cpu")
    assert isinstance(m, Measurement) and not m.oom
    # SGD: parameters + batch + gradients (2,112 B) are a floor for the step's peak
    assert MLP_PARAMS_BYTES * 2 + MLP_BATCH8_BYTES <= m.peak_allocated_bytes < 4 * (MLP_PARAMS_BYTES + MLP_BATCH8_BYTES)
    record = m.to_truth_record()
    assert tuple(record) == TRUTH_FIELDS
    assert record["optimizer"] == "sgd" and record["torch"] == m.torch and record["oom"] is False
    assert Measurement.from_dict(json.loads(json.dumps(m.to_dict()))) == m


def _tensor_count() -> int:
    import torch

    gc.collect()
    return sum(1 for o in gc.get_objects() if issubclass(type(o), torch.Tensor))


def test_fake_oom_in_a_trial_leaves_the_parent_unchanged(tmp_path, monkeypatch):
    job = tmp_path / "big.py"
    job.write_text(BIG_WORKLOAD)
    monkeypatch.setenv("GPUWISE_FAKE_OOM_ABOVE", "2")
    measure(str(job), 4, optimizer="sgd", steps=1, warmup=1, device="cpu")  # imports done, pools warm
    rss_before, tensors_before = psutil.Process().memory_info().rss, _tensor_count()
    m = measure(str(job), 4, optimizer="sgd", steps=1, warmup=1, device="cpu")
    assert m.oom and "out of memory at batch size 4" in m.error and "OutOfMemoryError" in m.error
    assert m.peak_allocated_bytes is None
    assert _tensor_count() == tensors_before                    # no tensor of the child's lives here
    assert psutil.Process().memory_info().rss - rss_before < 64 * 2**20  # the 256 MiB model stayed there
    assert multiprocessing.active_children() == []             # and the child is gone


def test_cli_oom_exits_3_with_json(monkeypatch, capsys):
    monkeypatch.setenv("GPUWISE_FAKE_OOM_ABOVE", "4")
    assert main(["measure", "examples:mlp", "-b", "8", "--device", "cpu", "--json"]) == 3
    captured = capsys.readouterr()
    d = json.loads(captured.out)
    assert d["oom"] is True and d["peak_allocated_bytes"] is None
    assert "out of memory at batch size 8" in captured.err


@pytest.mark.parametrize("args, needle", [
    (["examples:nope", "-b", "8", "--device", "cpu"], "no bundled example"),
    (["examples:mlp", "--device", "cpu"], "--batch-size"),
    (["examples:mlp", "-b", "8", "--device", "tpu:0"], "device"),
])
def test_cli_bad_input_is_one_line_exit_2(args, needle, capsys):
    assert main(["measure", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_measure_rejects_cuda_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(GpuwiseError, match="no CUDA GPU"):
        measure("examples:mlp", 8, device="cuda")
    with pytest.raises(GpuwiseError, match="needs a cuda device"):
        measure("examples:mlp", 8, device="cpu", snapshot="x.pickle")


def test_cli_max_batch_json(monkeypatch, capsys):
    monkeypatch.setenv("GPUWISE_FAKE_OOM_ABOVE", "2")
    assert main(["measure", "examples:mlp", "-b", "2", "--max-batch", "--limit", "3", "--device", "cpu",
                 "--optimizer", "sgd", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    # start 2 fits; 2 * 2 = 4 capped at --limit 3 fails; 3 - 2 = 1: done
    assert [t["batch_size"] for t in d["trials"]] == [2, 3]
    assert [t["status"] for t in d["trials"]] == ["ok", "oom"]
    assert d["max_batch_size"] == 2 and d["measurement"]["batch_size"] == 2
    validate("measure", d)


@pytest.mark.gpu
def test_gpu_oom_leaves_parent_cuda_memory_unchanged():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    before = torch.cuda.memory_allocated() if torch.cuda.is_initialized() else 0
    # gpt-mini at 65,536 x 256 tokens: its logits alone are 65536*256*8192*4 B = 512 GiB, a real OOM
    m = measure("examples:gpt-mini", 1 << 16, steps=1, warmup=1, device="cuda")
    assert m.oom and "out of memory" in m.error
    after = torch.cuda.memory_allocated() if torch.cuda.is_initialized() else 0
    assert after == before


@pytest.mark.gpu
def test_gpu_measure_reads_cuda_peaks():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    m = measure("examples:mlp", 8, optimizer="sgd", steps=3, device="cuda")
    assert m.peak_allocated_bytes >= MLP_PARAMS_BYTES * 2 + MLP_BATCH8_BYTES
    assert m.peak_reserved_bytes >= m.peak_allocated_bytes
    assert m.gpu_name and m.torch and m.cuda
