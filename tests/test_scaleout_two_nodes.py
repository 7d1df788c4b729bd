"""Two `gpuwise train` agents (two "nodes", one rank each) on loopback with a c10d rendezvous: the worker of
node rank 1 dies mid-run, torchrun's agents restart the group, and the job resumes from its checkpoint and
finishes every step."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from gpuwise.scaleout import checkpoint

WORKLOAD = """
import torch
from torch.nn import functional as F

def model():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))

def batch(batch_size):
    return torch.randn(batch_size, 8), torch.randn(batch_size, 4)

def loss(model, batch):
    x, y = batch
    return F.mse_loss(model(x), y)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_agents_on_loopback_restart_a_killed_worker_and_finish(tmp_path):
    job = tmp_path / "tiny_job.py"
    job.write_text(WORKLOAD)
    ckpt = str(tmp_path / "ckpt")
    env = {**os.environ, "GPUWISE_TEST_CRASH_AT_STEP": "3", "GPUWISE_TEST_CRASH_RANK": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (os.path.join(os.path.dirname(__file__), "..", "src"),
                                                     os.environ.get("PYTHONPATH")) if p)}
    args = [sys.executable, "-m", "gpuwise", "train", str(job), "--device", "cpu", "--nnodes", "2", "-n", "1",
            "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "loopback", "--steps", "6", "-b", "8",
            "--optimizer", "sgd", "--checkpoint-dir", ckpt, "--checkpoint-every", "2", "--max-restarts", "1",
            "--json"]
    agents = [subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(2)]
    outs = [a.communicate(timeout=900) for a in agents]  # a hang fails here, not a slow machine
    for a, (_, err) in zip(agents, outs):
        assert a.returncode == 0, err[-3000:]
    results = [json.loads(out) for out, _ in outs]
    holder = [r for r in results if r.get("result_on_this_node", True)]
    assert len(holder) == 1  # rank 0's agent holds the result, the other says so
    r = holder[0]
    # rank 0's node did not fail: its agent restarted its worker for the new membership, which torchrun does
    # not count as a restart (only the failed node's agent spends one of --max-restarts)
    assert r["world_size"] == 2 and r["resumed_from_step"] == 2, r
    assert r["steps_this_attempt"] == [3, 4, 5, 6]
    assert checkpoint.load(ckpt).step == 6
