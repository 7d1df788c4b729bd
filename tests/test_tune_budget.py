"""Defects found trying `gpuwise tune` as a new user: a workload that cannot even build is one line and
exit 2 (not a snippet and a `best`), and a short budget on a data-heavy workload still tries worker counts."""

from __future__ import annotations

import json

from gpuwise.cli import main

DATA_HEAVY = """
import time
import torch
from torch import nn
from torch.nn import functional as F


def model():  # per-step overhead dominates: every doubling of the batch gains, the batch search runs long
    return nn.Linear(64, 2)


def batch(n):
    return torch.randn(n, 64), torch.randint(0, 2, (n,))


def loss(m, b):
    x, y = b
    return F.cross_entropy(m(x), y)


class Decoded(torch.utils.data.Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        end = time.thread_time() + 0.001  # CPU decoding
        while time.thread_time() < end:
            pass
        return torch.randn(64), i % 2


def dataset():
    return Decoded()
"""


def test_a_workload_whose_model_raises_is_one_line_and_exit_2(tmp_path, capsys):
    wl = tmp_path / "job.py"
    wl.write_text("import torch\ndef model():\n    raise RuntimeError('no such layer')\n"
                  "def batch(n):\n    return torch.randn(n, 4)\n")
    code = main(["tune", str(wl), "--budget", "60s", "--measure", "0.2s", "--json"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""  # no JSON with a `best` block
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith("gpuwise tune: error: the workload as given fails, nothing to tune: ")
    assert "model() raised RuntimeError: no such layer" in last


def test_a_short_budget_still_tries_worker_counts(tmp_path, capsys):
    wl = tmp_path / "heavy.py"
    wl.write_text(DATA_HEAVY)
    code = main(["tune", str(wl), "--budget", "60s", "--measure", "0.5s", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert code == 0
    with_workers = [t for t in d["trials"] if t["kind"] == "train" and (t["num_workers"] or 0) >= 1]
    assert with_workers, [(t["kind"], t["batch_size"], t["num_workers"]) for t in d["trials"]]
    assert d["elapsed_s"] <= 60 * 1.25
