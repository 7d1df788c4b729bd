"""The allocator model against the real CUDA caching allocator (needs a GPU; skipped cleanly without one).

A fresh process runs three training steps with the allocator's history recorded; every alloc/free the
real allocator saw (cuBLAS workspaces included) is replayed through `gpuwise.plan.memory.allocator`. With the
same requests in the same order, the model must reproduce the real peaks of reserved and allocated
memory: this checks the model itself, separately from the tracer's prediction of the requests.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

CHILD = r"""
import json, sys, torch
from gpuwise.step import StepConfig, TrainStep
from gpuwise.workload import load_workload
from gpuwise.measuring.snapshot import to_trace
from gpuwise.plan.memory.allocator import replay

spec, batch_size, precision = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.cuda.init()
torch.cuda.memory._record_memory_history(max_entries=1_000_000)
wl = load_workload(spec)
step = TrainStep(wl, StepConfig(precision=precision), "cuda")
batch = step.to_device(wl.build_batch(batch_size))
for _ in range(3):
    step.step(batch, on_device=True)
torch.cuda.synchronize()
snap = torch.cuda.memory._snapshot()
trace = to_trace(snap, torch.cuda.current_device())
trace.steady_start = 0
model = replay(trace)
print(json.dumps({"real_reserved": torch.cuda.max_memory_reserved(), "real_allocated": torch.cuda.max_memory_allocated(),
                  "model_reserved": model.max_reserved_bytes, "model_allocated": model.max_allocated_bytes,
                  "segments": model.segments, "events": len(trace.events), "notes": trace.notes}))
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("spec, batch_size, precision", [("examples:gpt-mini", 16, "fp32"),
                                                        ("examples:resnet", 64, "bf16")])
def test_model_replays_the_real_allocators_requests_to_the_same_peaks(spec, batch_size, precision):
    proc = subprocess.run([sys.executable, "-c", CHILD, spec, str(batch_size), precision],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    print(r)
    assert r["model_reserved"] == r["real_reserved"], r
    assert r["model_allocated"] == r["real_allocated"], r
