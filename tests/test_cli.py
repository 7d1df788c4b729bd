"""The CLI over fake GPUs: contract output, pass-through exit codes, one-line errors with exit code 2."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import FOUR_GPUS, run_cli

from gpuwise import __version__
from gpuwise.cli import COMMANDS, build_parser
from gpuwise.contracts import validate

FAKE = {"GPUWISE_FAKE_GPUS": str(FOUR_GPUS)}


def assert_one_line_error(proc, pattern: str):
    import re

    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert re.search(pattern, lines[0]), lines[0]


def test_version():
    assert run_cli("--version").stdout.strip() == f"gpuwise {__version__}"


def test_pick_two_with_min_free_prints_the_value():
    proc = run_cli("pick", "-n", "2", "--min-free", "10GiB", env=FAKE)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "1,3\n"  # 80 GB idle A100, then the 80 GB A100 at 40%; not the 6.8 GiB-free one


def test_pick_json_contract():
    proc = run_cli("pick", "-n", "2", "--min-free", "10GiB", "--json", env=FAKE)
    data = json.loads(proc.stdout)
    assert data["cuda_visible_devices"] == "1,3"
    assert [d["index"] for d in data["devices"]] == [1, 3]
    for d in data["devices"]:
        assert {"index", "uuid", "name", "memory_free_bytes", "utilization_pct"} <= set(d)
    assert data["devices"][0]["uuid"] == "GPU-bbbbbbbb-1111-1111-1111-111111111111"
    assert data["devices"][0]["memory_free_bytes"] == (81920 - 4) * 1024**2


def test_pick_leases_so_a_second_pick_gets_other_gpus():
    first = run_cli("pick", "-n", "2", env=FAKE)
    second = run_cli("pick", "-n", "2", env=FAKE)
    assert set(first.stdout.strip().split(",")).isdisjoint(second.stdout.strip().split(","))


def test_gpus_json_and_table():
    data = json.loads(run_cli("gpus", "--json", env=FAKE).stdout)
    assert data["backend"] == "fake" and len(data["gpus"]) == 4 and data["best_index"] == 1
    table = run_cli("gpus", env=FAKE).stdout
    assert "A100-SXM4-80GB" in table and "★" in table


def test_run_passes_exit_code_and_environment():
    proc = run_cli("run", "--", "sh", "-c", 'echo "$CUDA_DEVICE_ORDER $CUDA_VISIBLE_DEVICES"; exit 3', env=FAKE)
    assert proc.returncode == 3
    assert proc.stdout == "PCI_BUS_ID 1\n"


def test_run_holds_the_gpu_while_the_command_runs(tmp_path):
    import os
    import subprocess
    import sys
    import time

    flag = tmp_path / "started"
    env = dict(os.environ, **FAKE)
    outer = subprocess.Popen([sys.executable, "-m", "gpuwise", "run", "--", "sh", "-c", f"touch {flag}; sleep 4"], env=env)
    try:
        deadline = time.time() + 60
        while not flag.exists() and time.time() < deadline:
            time.sleep(0.05)
        assert run_cli("pick", "--no-reserve", env=FAKE).stdout.strip() == "3"  # gpu 1 is held by the running command
    finally:
        assert outer.wait(timeout=60) == 0
    assert run_cli("pick", "--no-reserve", env=FAKE).stdout.strip() == "1"  # released when it ended


def test_a_job_inside_run_may_pick_its_own_gpu():
    # train.py started by `gpuwise run` calls pick() itself: its parent's reservation is its own
    inner = f"{sys.executable} -m gpuwise pick"
    proc = run_cli("run", "--", "sh", "-c", inner, env=FAKE)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1"


@pytest.mark.parametrize("args, pattern", [
    (["pick", "--min-free", "banana"], r"cannot read 'banana' as a size"),
    (["pick", "-n", "5"], r"asked for 5 GPUs but this machine has 4"),
    (["pick", "-n", "2", "--min-free", "75GiB"], r"need 2 GPU\(s\) with ≥ 75 GiB free; 1 of 4 qualify"),
    (["pick", "--wait", "forever"], r"cannot read 'forever' as a duration"),
    (["run"], r"no command given"),
    (["run", "--", "/no/such/program"], r"cannot start '/no/such/program'"),
])
def test_bad_input_is_one_line_and_exit_2(args, pattern):
    assert_one_line_error(run_cli(*args, env=FAKE), pattern)


def test_malformed_fake_gpu_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('[{"index": 0, "name": "X"}]')
    assert_one_line_error(run_cli("gpus", env={"GPUWISE_FAKE_GPUS": str(bad)}), r"GPU entry 0 is malformed")
    assert_one_line_error(run_cli("pick", env={"GPUWISE_FAKE_GPUS": str(tmp_path / "missing.json")}), "cannot read the file")


@pytest.mark.parametrize("text, pattern", [
    ("import torch\ndef model(): return torch.nn.Linear(1, 1)\n", r"defines no batch\(batch_size\) function"),
    ("def model(:\n", r"SyntaxError: .* \(line 1\)"),
])
def test_bad_workload_file_is_one_line_and_exit_2(tmp_path, text, pattern):
    job = tmp_path / "job.py"
    job.write_text(text)
    assert_one_line_error(run_cli("demo", str(job), "--no-measure"), pattern)


def test_every_command_has_help_with_examples():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert {"demo", "gpus", "pick", "run"} <= set(sub.choices)
    for name, p in sub.choices.items():
        assert name in COMMANDS
        assert "examples:" in p.format_help() and "gpuwise " + name in p.format_help()


@pytest.mark.parametrize("args, pattern", [
    (["estimate", "examples:mlp", "-b", "0"], r"--batch-size: expected a positive integer, got '0'"),
    (["estimate", "examples:mlp", "-b", "2", "--optimizer", "lion"], r"invalid choice: 'lion'"),
    (["pick", "-n", "two"], r"expected a positive integer, got 'two'"),
    (["frobnicate"], r"invalid choice: 'frobnicate'"),
    # --gpu all is for a list of answers (fit); where one GPU answers it says so
    (["estimate", "examples:mlp", "-b", "2", "--gpu", "all"], r"--gpu all: `gpuwise estimate` answers for one GPU"),
    (["measure", "examples:mlp", "--gpu", "all"], r"--gpu all: `gpuwise measure` answers for one GPU \(cuda"),
    (["tune", "examples:mlp", "--gpu", "all"], r"--gpu all: `gpuwise tune` answers for one GPU"),
])
def test_bad_arguments_are_one_line_too(args, pattern):
    assert_one_line_error(run_cli(*args, env=FAKE), pattern)


def test_demo_plans_and_measures_on_the_cpu():
    # the README's main command, on the smallest example: the plan must agree with the measured CPU peak
    proc = run_cli("demo", "examples:mlp", "--batch-size", "8", "--json", env={"GPUWISE_FAKE_GPUS": ""})
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    validate("demo", data)
    assert data["device"] == "cpu" and data["parameters"] == 32 * 16 + 16
    planned, measured = data["plan"]["peak_allocated_bytes"], data["measure"]["peak_allocated_bytes"]
    assert abs(planned - measured) <= 0.01 * measured
    assert data["plan_gpu"]["gpu"] and data["plan_gpu"]["max_batch_size"] > 8
