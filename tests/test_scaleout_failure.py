"""A DDP rank that dies: one line saying which rank and how, with the hint to checkpoint and restart,
instead of ~65 lines of torch tracebacks (the ranks' output is kept in a log file)."""

from __future__ import annotations

import pytest

from gpuwise.cli import main
from gpuwise.scaleout.failure import summarize_failure

TORCHRUN_TAIL = """\
[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer
E1123 10:37:40.050000 2441 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
gpuwise.scaleout.worker FAILED
------------------------------------------------------
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 2447)  (SIGTERM)
  traceback : Signal 15 (SIGTERM) received by PID 2447
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_10:37:39
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 2448)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 2448
======================================================
"""

JOB = """
import os, signal
import torch
from torch import nn
from torch.nn import functional as F

def model():
    return nn.Linear(8, 2)

def batch(n):
    return torch.randn(n, 8), torch.randint(0, 2, (n,))

_calls = [0]
def loss(m, b):
    _calls[0] += 1
    if _calls[0] == 3 and os.environ.get("RANK") == "1":
        os.kill(os.getpid(), signal.SIGKILL)  # the rank dies (the OOM killer, a preemption)
    x, y = b
    return F.cross_entropy(m(x), y)
"""


def test_the_root_cause_not_the_consequences():
    line = summarize_failure(TORCHRUN_TAIL)
    assert line.startswith("rank 1 (pid 2448) was killed by signal 9 (SIGKILL)")
    tail = TORCHRUN_TAIL.split("\n", 1)[1]  # without rank 0's gloo error: here rank 0 itself failed
    raised = "[rank0]: Traceback (most recent call last):\n[rank0]: ValueError: bad batch\n" + tail.replace(
        "traceback : Signal 9 (SIGKILL) received by PID 2448", "traceback : To enable traceback see ...").replace(
        "rank      : 1 (local_rank: 1)", "rank      : 0 (local_rank: 0)")
    assert summarize_failure(raised) == "rank 0 (pid 2448) raised ValueError: bad batch"
    assert summarize_failure("nothing useful") is None


@pytest.mark.slow
def test_a_killed_rank_is_one_line_with_the_restart_hint(tmp_path, capsys):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    assert main(["train", str(job), "-n", "2", "--steps", "6", "-b", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    last = err[-1]
    assert last.startswith("gpuwise train: error: training failed: rank 1 (pid ")
    assert "was killed by signal 9 (SIGKILL)" in last and "--checkpoint-dir" in last and "--max-restarts" in last
    assert not any("Traceback" in line for line in err)
    log = last.split("the ranks' output: ")[1].split(";")[0]
    with open(log) as fh:
        assert "ChildFailedError" in fh.read()  # nothing is lost: the full output is kept
