"""Shared fixtures. Every test gets its own reservation folder, so tests never see each other's GPUs held."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# pytest-xdist's workers (the README's `-n 2`) set COLUMNS=80 and LINES=24, which a terminal would; the suite's
# commands write to pipes, whose tables are 150 columns wide unless COLUMNS says otherwise (report/console.py).
# Dropped before gpuwise is imported, so that a test sees the same output in a worker as in one process.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

DATA = Path(__file__).parent / "data"
FOUR_GPUS = DATA / "four_gpus.json"


@pytest.fixture(autouse=True)
def _isolated_environment(tmp_path_factory):
    """Each test gets its own reservation folder and its environment back afterwards: `pick()` sets
    CUDA_VISIBLE_DEVICES in os.environ, which must not leak into the next test."""
    saved = dict(os.environ)
    os.environ["GPUWISE_LOCK_DIR"] = str(tmp_path_factory.mktemp("locks"))
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def fake_gpus(monkeypatch):
    """The four fake GPUs of tests/data/four_gpus.json (an 80 GB A100 idle, one 40% busy, a busy 40 GB A100, an L4)."""
    monkeypatch.setenv("GPUWISE_FAKE_GPUS", str(FOUR_GPUS))
    return json.loads(FOUR_GPUS.read_text())


@pytest.fixture
def init_reads_data(monkeypatch):
    """A truncated-normal initialiser that reads its tensor's data (`.item()`, which fake tensors refuse), as
    torch 2.13's rejection sampling does: a ViT's initialisation then reads data under fake tensors, and is
    built with real weights and copied (plan/tracing/setup.py `build_model_for_trace`), whichever torch runs."""
    from gpuwise.plan.tracing import setup

    in_place = setup._trunc_normal_in_place

    def reading(tensor, *args, **kwargs):
        tensor.sum().item()
        return in_place(tensor, *args, **kwargs)

    monkeypatch.setattr(setup, "_trunc_normal_in_place", reading)
    return in_place  # the sampler that reads no data, for a test to put back


@pytest.fixture
def write_fake(tmp_path, monkeypatch):
    """Write a fake-GPU file (a list of dicts, or raw text) and point GPUWISE_FAKE_GPUS at it."""
    def write(content) -> Path:
        path = tmp_path / "gpus.json"
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        monkeypatch.setenv("GPUWISE_FAKE_GPUS", str(path))
        return path
    return write


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `python -m gpuwise ARGS` in a subprocess (real exit codes, real stdout/stderr)."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "gpuwise", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout)


@pytest.fixture
def json_script(tmp_path):
    """Run a Python script's text in a fresh interpreter (PYTHONPATH=src, a bare PATH: the worker scripts that
    spawn gloo ranks) and return the JSON of its last stdout line; a failing script fails the test with its stderr."""
    def run(text: str, name: str = "script.py", timeout: float = 300):
        path = tmp_path / name
        path.write_text(text)
        proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=timeout,
                              env={"PYTHONPATH": "src", "PATH": "/usr/bin:/bin"})
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])
    return run
