"""nn.LSTM / nn.GRU traced for the cuda target run cuDNN's RNN (plan/tracing/cudnn_rnn.py): one forward
and one backward op over all layers and timesteps, the reserve space kept between them, priced as the
GEMMs cuDNN runs; the CPU target and packed sequences keep torch's own kernels."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from gpuwise.plan.tracing.kernels import cudnn_rnn_reserve_bytes
from gpuwise.plan.tracing.trace import trace_step
from gpuwise.step import StepConfig
from gpuwise.workload import Workload

SEQ, FEATURES, HIDDEN, LAYERS, CLASSES = 32, 128, 256, 2, 5


class Tagger(nn.Module):
    def __init__(self, kind: str, packed: bool = False):
        super().__init__()
        cls = nn.LSTM if kind == "lstm" else nn.GRU
        self.rnn = cls(FEATURES, HIDDEN, num_layers=LAYERS, batch_first=True, bidirectional=kind == "gru")
        self.head = nn.Linear(HIDDEN * (2 if kind == "gru" else 1), CLASSES)
        self.packed = packed

    def forward(self, x):
        if self.packed:
            lengths = torch.full((x.shape[0],), SEQ, dtype=torch.int64)
            out, _ = self.rnn(nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True))
            out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        else:
            out, _ = self.rnn(x)
        return self.head(out.mean(dim=1))


def _batch(b):
    g = torch.Generator().manual_seed(b)
    return torch.rand(b, SEQ, FEATURES, generator=g), torch.randint(0, CLASSES, (b,), generator=g)


def _loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def _trace(kind, target, precision="fp32", packed=False, batch=8):
    wl = Workload(f"{kind}-tagger", lambda: Tagger(kind, packed), _batch, _loss)
    return trace_step(wl, batch, StepConfig(optimizer="sgd", precision=precision), target=target)


def _steady_ops(trace) -> set[str]:
    return {e.op for e in trace.events[trace.steady_start:]}


@pytest.mark.parametrize("kind,mode", [("lstm", 2), ("gru", 3)])
def test_cuda_target_runs_one_cudnn_op_each_way_with_its_reserve(kind, mode):
    trace = _trace(kind, "cuda")
    assert trace.method == "fake-trace"
    ops = _steady_ops(trace)
    assert {"aten._cudnn_rnn", "kernel workspace: aten._cudnn_rnn_backward"} <= ops, sorted(ops)
    assert not {o for o in ops if "mkldnn_rnn" in o or "gru_cell" in o}
    reserve = [e for e in trace.events[trace.steady_start:]
               if e.action == "alloc" and e.op == "aten._cudnn_rnn" and e.nbytes > 1024 * 1024]
    x = torch.empty(8, SEQ, FEATURES)
    expected = cudnn_rnn_reserve_bytes(x, mode, HIDDEN, LAYERS, kind == "gru", True, True)
    # LSTM: 6 hidden-wide vectors (4 gates, c, h), GRU: 10, per layer, direction, step and sample
    assert expected == LAYERS * (2 if kind == "gru" else 1) * SEQ * 8 * HIDDEN * 4 * (6 if kind == "lstm" else 10)
    assert expected in {e.nbytes for e in reserve}
    costs = trace.op_costs
    # the recurrent GEMM once per timestep per layer and direction, forward (m = batch, n = gates x hidden)
    gates = 4 if kind == "lstm" else 3
    recurrent = sum(c for (phase, _, m, n, k, *_), c in costs.gemms.items()
                    if phase == "forward" and (m, n, k) == (8, gates * HIDDEN, HIDDEN))
    assert recurrent == LAYERS * (2 if kind == "gru" else 1) * SEQ
    # and backward: dh W_hh once per step, the input and weight gradients once over all steps
    back = sum(c for (phase, _, m, n, k, *_), c in costs.gemms.items()
               if phase == "backward" and (m, n, k) == (8, HIDDEN, gates * HIDDEN))
    assert back == recurrent
    assert trace.flops_per_step > 3 * 2 * 8 * SEQ * gates * HIDDEN * (FEATURES + HIDDEN)  # RNN FLOPs counted


def test_bf16_autocast_runs_cudnn_in_float16_with_a_flat_weight_copy():
    trace = _trace("lstm", "cuda", precision="bf16")
    steady = trace.events[trace.steady_start:]
    params = sum(p.numel() for p in Tagger("lstm").rnn.parameters())
    assert any(e.action == "alloc" and e.nbytes == params * 2 for e in steady)  # the float16 flat buffer
    assert "aten._cudnn_rnn" in _steady_ops(trace)


def test_cpu_target_and_packed_sequences_keep_torchs_kernels():
    assert "aten._cudnn_rnn" not in _steady_ops(_trace("lstm", "cpu"))
    assert "aten._cudnn_rnn" not in _steady_ops(_trace("gru", "cpu"))
    assert "aten._cudnn_rnn" not in _steady_ops(_trace("lstm", "cuda", packed=True))
    assert torch._VF.lstm is torch._C._VariableFunctions.lstm  # the routing is undone after the trace
