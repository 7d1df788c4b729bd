"""A trace taken first in a process equals the same trace taken later: a library's once-per-process
tensors (bitsandbytes' first AdamW8bit) are made outside the trace (step.warm_optimizer)."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("bitsandbytes")

CONFIG = os.path.join(os.path.dirname(__file__), "data", "configs", "tiny-llama.json")

SCRIPT = f"""
from gpuwise.hf import hf_workload
from gpuwise.plan.tracer import trace_workload
from gpuwise.step import StepConfig
wl = hf_workload({CONFIG!r}, seq_len=16)
cfg = StepConfig(optimizer="adamw8bit", precision="bf16")
first, second = ([(e.action, e.nbytes, e.op) for e in trace_workload(wl, 1, cfg, "cuda").events] for _ in range(2))
print(len(first), len(second), first == second)
"""


def test_the_first_adamw8bit_trace_in_a_process_equals_the_next():
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    n1, n2, same = out.stdout.split()[-3:]
    assert same == "True", (n1, n2)
