"""litgpt's own model code as a workload (benchmarks/published/workloads/_litgpt.py): the adapter and adapter_v2
fine-tuning steps traced under fake tensors against the CPU profiler on real tensors, on a tiny litgpt config."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

pytest.importorskip("litgpt")

from gpuwise.plan.memory.events import live_peak  # noqa: E402
from gpuwise.plan.tracing.cpu_truth import measure_cpu_peak  # noqa: E402
from gpuwise.plan.tracing.trace import trace_step  # noqa: E402
from gpuwise.step import StepConfig  # noqa: E402
from gpuwise.workload import from_module  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks" / "published" / "workloads"))

import _litgpt  # noqa: E402

TOLERANCE = 0.005  # 0.5 % of the profiler's peak, as test_plan_modes


def _workload(method: str, **fields):
    model, batch, loss = _litgpt.workload("pythia-14m", method, 64, **fields)
    return from_module(types.SimpleNamespace(model=model, batch=batch, loss=loss), f"litgpt:{method}")


LORA_QV = {"lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.05, "lora_query": True, "lora_value": True}


@pytest.mark.parametrize("method", ["adapter", "adapter_v2", "lora"])
def test_litgpt_adapter_step_matches_cpu_profiler(method):
    wl = _workload(method, **(LORA_QV if method == "lora" else {}))
    cfg = StepConfig(optimizer="adamw", precision="fp32")
    trace = trace_step(wl, 2, cfg, target="cpu")
    assert trace.method == "fake-trace"
    peak, truth = live_peak(trace).allocated_bytes, measure_cpu_peak(wl, 2, cfg)
    assert abs(peak - truth) <= TOLERANCE * truth, (method, peak, truth)


def test_only_the_adapter_trains():
    model = _workload("adapter").build_model()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("adapter_wte" in n or "gating_factor" in n for n in trainable)
    # pythia-14m: 6 layers, adapters from layer 2 (litgpt's adapter_start_layer), 10 prefix tokens of 128
    assert sum(p.numel() for n, p in model.named_parameters() if "adapter_wte" in n) == 4 * 10 * 128


def test_only_lora_trains_on_the_parts_the_config_names():
    model = _workload("lora", **LORA_QV).build_model()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith(("lora_A", "lora_B")) for n in trainable)
    # pythia-14m: 6 layers; q and v in the fused qkv (LoRAQKVLinear): lora_A (2r x 128), lora_B (2 x 128, r) a layer
    assert sum(p.numel() for n, p in model.named_parameters() if n.endswith("lora_A")) == 6 * 2 * 8 * 128
    assert sum(p.numel() for n, p in model.named_parameters() if n.endswith("lora_B")) == 6 * 2 * 128 * 8


def test_fabric_output_casts_the_logits_as_lightning_does():
    """litgpt's scripts call the model through Fabric, whose `_FabricModule.forward` ends with the precision
    plugin's `convert_output`: bf16-true's (HalfPrecision) casts the bf16 logit chunks to float32."""
    import torch
    from lightning.fabric.plugins.precision.half import HalfPrecision

    chunks = [torch.zeros(2, 4, 8, dtype=torch.bfloat16), torch.zeros(2, 3, 8, dtype=torch.bfloat16)]
    ours, fabric = _litgpt.fabric_output(chunks), HalfPrecision("bf16-true").convert_output(chunks)
    assert [t.dtype for t in ours] == [t.dtype for t in fabric] == [torch.float32, torch.float32]
    assert _litgpt.fabric_output(torch.zeros(2, dtype=torch.bfloat16)).dtype == torch.float32


def test_bf16_true_step_holds_the_float32_logits():
    """Under bf16-true the step's peak holds the float32 logits and their float32 log-softmax: traced
    against the CPU profiler, and above the same step without Fabric's cast by at least twice the bf16
    logits' bytes (the float32 copy doubles both the logits and the saved log-softmax)."""
    wl = _workload("lora", **LORA_QV)
    cfg = StepConfig(optimizer="adamw", precision="bf16-pure")
    trace = trace_step(wl, 2, cfg, target="cpu")
    peak, truth = live_peak(trace).allocated_bytes, measure_cpu_peak(wl, 2, cfg)
    assert abs(peak - truth) <= TOLERANCE * truth, (peak, truth)
    original = _litgpt.fabric_output
    try:
        _litgpt.fabric_output = lambda logits: logits
        bare = live_peak(trace_step(_workload("lora", **LORA_QV), 2, cfg, target="cpu")).allocated_bytes
    finally:
        _litgpt.fabric_output = original
    logits_bf16 = 2 * 64 * 50304 * 2  # batch 2 x 64 tokens x pythia-14m's padded vocabulary, 2 bytes
    assert peak - bare >= 2 * logits_bf16 * 0.95, (peak, bare)


def test_the_resource_tables_code_is_litgpt_at_8641822():
    """The resource tables ran litgpt at commit 8641822 (lit_gpt/, Lightning-AI/litgpt): its LoRA model,
    with finetune/lora.py's defaults there (r 8, q and v), builds and trains only LoRA's q and v parts."""
    model, _, _ = _litgpt.workload("pythia-70m", "lora", 64, package="lit_gpt", r=8, alpha=16, dropout=0.05,
                                   to_query=True, to_value=True)
    m = model()
    assert type(m).__module__ == "lit_gpt.lora"
    trainable = {n: p.numel() for n, p in m.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith(("lora_A", "lora_B")) for n in trainable)
    # pythia-70m: 6 layers, 512 wide; q and v: lora_A (2r x 512), lora_B (2 x 512, r) a layer
    assert sum(trainable.values()) == 6 * (2 * 8 * 512 + 2 * 512 * 8)
