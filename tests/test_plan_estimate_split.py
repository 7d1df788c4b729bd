"""`estimate -n N --strategy S`: one rank's memory, by the same transform of the trace that `fit` uses."""

import json

import pytest

from gpuwise.cli import main
from gpuwise.errors import GpuwiseError
from gpuwise.plan import estimate
from gpuwise.plan.memory.nccl import buffer_bytes
from gpuwise.plan.memory.split import Split
from gpuwise.plan.scaled import Evaluator
from gpuwise.plan.tracing.modes import TrainingModes
from gpuwise.step import StepConfig

WL, BATCH = "examples:mlp", 16


def test_per_rank_memory_is_fits_number_for_every_strategy():
    ev = Evaluator(WL, "hopper")
    single = estimate(WL, BATCH, gpu="H100", search_max_batch=False)
    seen = {}
    for strategy in ("ddp", "zero1", "zero2", "fsdp", "fsdp-grad-op"):
        est = estimate(WL, BATCH, gpu="H100", nproc=2, strategy=strategy, search_max_batch=False)
        point = ev.evaluate(BATCH, StepConfig(), TrainingModes(), Split(strategy, 2))
        assert (est.nproc, est.strategy) == (2, strategy)
        # fit adds a rank's NCCL buffers to its point (plan/fit.py `_option`), as estimate counts them
        nccl = buffer_bytes(Split(strategy, 2), "nvlink4")
        assert est.overheads.nccl_bytes == nccl > 0
        assert est.device_used_bytes == point.device_used_bytes + nccl, strategy
        seen[strategy] = est.by_category
    assert seen["zero1"]["optimizer_state"] < single.by_category["optimizer_state"]
    assert seen["zero2"]["gradients"] < single.by_category["gradients"]
    assert seen["fsdp"]["parameters"] < single.by_category["parameters"]


def test_split_arguments_are_checked():
    with pytest.raises(GpuwiseError, match="strategy"):
        estimate(WL, BATCH, nproc=2, strategy="zero9")
    with pytest.raises(GpuwiseError, match="pipeline"):
        estimate(WL, BATCH, nproc=2, strategy="pipeline")
    with pytest.raises(GpuwiseError, match="-n 1"):
        estimate(WL, BATCH, nproc=2, strategy="single")


def test_cli_nproc_and_strategy(capsys):
    assert main(["estimate", WL, "-b", str(BATCH), "-n", "2", "--strategy", "fsdp", "--no-max-batch", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["nproc"], d["strategy"]) == (2, "fsdp")
    assert main(["estimate", WL, "-b", str(BATCH), "--nproc", "2", "--no-max-batch", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["strategy"] == "ddp"


def test_every_fit_option_carries_the_estimate_that_reproduces_it(capsys):
    import shlex

    from gpuwise.plan.fit import fit

    wl = "examples:gpt-mini"  # has blocks to checkpoint
    result = fit(wl, "L4", 2, 8)
    checked = 0
    for option in result.options:
        if option.changes["strategy"] == "pipeline":
            assert option.estimate_cmd is None  # estimate does not split the layers into stages
            continue
        args = shlex.split(option.estimate_cmd)
        assert args[:3] == ["gpuwise", "estimate", wl]
        assert main([*args[1:], "--json"]) == 0
        d = json.loads(capsys.readouterr().out)
        assert d["device_used_bytes"] == option.device_used_bytes, option.name
        assert (d["nproc"], d["batch_size"], d["grad_accum"]) == (
            option.changes["nproc"], option.micro_batch_size, option.grad_accum)
        checked += 1
    assert checked >= 8


def test_measure_and_tune_take_gpu_and_keep_device():
    import argparse

    from gpuwise.commands import measure, tune

    for command in (measure, tune):
        p = argparse.ArgumentParser()
        command.add_arguments(p)
        assert p.parse_args(["examples:mlp", "--gpu", "cuda:1"]).device == "cuda:1"
        assert p.parse_args(["examples:mlp", "--device", "cpu"]).device == "cpu"  # scripts rely on --device
