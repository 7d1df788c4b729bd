"""Workload files: loading files, modules and examples; one-line errors for bad ones."""

from __future__ import annotations

import textwrap

import pytest
import torch

from gpuwise.errors import WorkloadError
from gpuwise.step import StepConfig, TrainStep, make_optimizer
from gpuwise.workload import Workload, list_examples, load_workload

GOOD = """
import torch
def model():
    return torch.nn.Linear(4, 2)
def batch(n):
    return torch.randn(n, 4), torch.randint(0, 2, (n,))
def loss(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)
"""


def write(tmp_path, text, name="job.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_bundled_examples_follow_the_contract():
    assert {"mlp", "lenet", "resnet", "gpt-mini"} <= set(list_examples())
    for name in ("mlp", "lenet"):
        wl = load_workload(f"examples:{name}")
        model = wl.build_model()
        assert wl.compute_loss(model, wl.build_batch(3)).ndim == 0
        assert len(wl.build_dataset()) > 0


def test_mlp_is_the_seeds_net():
    # seed 000: batch 100, input 32, output 16 -> weights 32*16 + bias 16 = 528 parameters
    wl = load_workload("examples:mlp")
    assert sum(p.numel() for p in wl.build_model().parameters()) == 32 * 16 + 16
    x, y = wl.build_batch(100)
    assert x.shape == (100, 32)


def test_file_workload_and_a_training_step(tmp_path):
    wl = load_workload(write(tmp_path, GOOD))
    ts = TrainStep(wl, StepConfig(optimizer="sgd"))
    before = ts.model.weight.detach().clone()
    ts.step(wl.build_batch(8))
    assert not torch.equal(before, ts.model.weight)  # the step trained
    assert all(p.grad is None for p in ts.model.parameters())  # zero_grad(set_to_none=True)


def test_module_workload(tmp_path, monkeypatch):
    write(tmp_path, GOOD, "myjob_mod.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_workload("myjob_mod").build_batch(2)[0].shape == (2, 4)


def test_dict_batch_uses_model_loss():
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    wl = Workload(
        spec="bert", model_fn=lambda: BertForSequenceClassification(cfg),
        batch_fn=lambda n: {"input_ids": torch.randint(0, 50, (n, 8)), "labels": torch.randint(0, 2, (n,))})
    assert wl.compute_loss(wl.build_model(), wl.build_batch(2)).ndim == 0


@pytest.mark.parametrize("text, message", [
    ("import torch\ndef model(): return torch.nn.Linear(1, 1)\n", r"defines no batch\(batch_size\) function"),
    ("def batch(n): pass\n", r"defines no model\(\) function"),
    ("def model(:\n", "SyntaxError"),
    ("import not_a_module_xyz\n", "ModuleNotFoundError"),
    ("model = 3\ndef batch(n): pass\n", "model must be a function"),
    ("def model(): pass\ndef batch(): pass\n", r"batch\(\) must take 1 argument"),
])
def test_bad_files_give_one_line(tmp_path, text, message):
    with pytest.raises(WorkloadError, match=message) as info:
        load_workload(write(tmp_path, text))
    assert "\n" not in str(info.value)


def test_wrong_return_types(tmp_path):
    wl = load_workload(write(tmp_path, "def model(): return 3\ndef batch(n): return 'x'\n"))
    with pytest.raises(WorkloadError, match="must return a torch.nn.Module, got int"):
        wl.build_model()
    with pytest.raises(WorkloadError, match="must return a Tensor"):
        wl.build_batch(2)
    with pytest.raises(WorkloadError, match="positive integer"):
        wl.build_batch(0)


def test_user_code_raising_is_one_line(tmp_path):
    wl = load_workload(write(tmp_path, "def model(): raise ValueError('bad config\\nsecond line')\ndef batch(n): pass\n"))
    with pytest.raises(WorkloadError, match=r"model\(\) raised ValueError: bad config$"):
        wl.build_model()


def test_unknown_example_and_missing_file():
    with pytest.raises(WorkloadError, match="no bundled example 'nope'; choose from"):
        load_workload("examples:nope")
    with pytest.raises(WorkloadError, match=r"no workload file '/.*exist.py'$"):
        load_workload("does/not/exist.py")
    # a Hub model id typed without its prefix: the message says how to name it
    with pytest.raises(WorkloadError, match=r"no workload file 'meta-llama/Llama-3.1-8B'; .* write hf:meta-llama/"):
        load_workload("meta-llama/Llama-3.1-8B")


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "adamw", "adagrad", "rmsprop"])
def test_optimizer_registry(name):
    p = [torch.nn.Parameter(torch.zeros(3))]
    assert isinstance(make_optimizer(name, p), torch.optim.Optimizer)


def test_bad_optimizer_and_precision():
    from gpuwise.errors import GpuwiseError

    with pytest.raises(GpuwiseError, match="unknown optimizer 'lion'"):
        StepConfig(optimizer="lion")
    with pytest.raises(GpuwiseError, match="unknown precision 'fp8'"):
        StepConfig(precision="fp8")


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16", "fp16", "bf16-pure"])
def test_every_precision_trains_on_cpu(precision):
    wl = load_workload("examples:lenet")
    ts = TrainStep(wl, StepConfig(precision=precision))
    loss = ts.step(wl.build_batch(4))
    assert torch.isfinite(loss)
    assert (ts.scaler is not None) == (precision == "fp16")


def test_checkpointing_wraps_the_repeated_blocks():
    from gpuwise.step import enable_checkpointing

    wl = load_workload("examples:resnet")
    model = wl.build_model()
    assert enable_checkpointing(model) == 8  # four stages of two basic blocks
    x, y = wl.build_batch(2)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    assert model.stem[0].weight.grad is not None
