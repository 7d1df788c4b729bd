"""FLOPs and the roofline bound, with the arithmetic written out; the estimate on a data-dependent model."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwise.plan import estimate
from gpuwise.plan.catalog import CATALOG
from gpuwise.plan.flops import count_flops, roofline, traffic_bytes
from gpuwise.workload import load_workload

WORKLOADS = Path(__file__).parent / "workloads"


def test_roofline_takes_the_slower_of_compute_and_memory():
    h100 = CATALOG["h100-sxm"]
    # 2 x 989.5e12 FLOPs at 989.5 TFLOP/s (bf16 dense) = 2 s; 3.35e12 bytes at 3.35 TB/s = 1 s -> compute-bound
    r = roofline(int(2 * 989.5e12), int(3.35e12), batch_size=8, gpu=h100, precision="bf16")
    assert r.compute_s == pytest.approx(2.0) and r.memory_s == pytest.approx(1.0)
    assert r.time_s == pytest.approx(2.0) and r.bound == "compute" and r.samples_per_s == pytest.approx(4.0)
    # the same FLOPs in fp32 (67 TFLOP/s) take 29.5 s
    assert roofline(int(2 * 989.5e12), 0, 8, h100, "fp32").time_s == pytest.approx(2 * 989.5 / 67)


def test_traffic_counts_each_category_as_often_as_a_step_moves_it():
    # parameters 4x, gradients 2x (at least as many bytes as parameters), optimizer state 2x, activations 2x
    cats = {"parameters": 100, "gradients": 0, "optimizer_state": 200, "activations": 50, "temporary": 999}
    assert traffic_bytes(cats) == 4 * 100 + 2 * 100 + 2 * 200 + 2 * 50


def test_meta_flop_count_agrees_with_the_trace():
    # Linear(32, 16) at batch 4: forward 2*4*32*16 = 4096, weight gradient 4096, no input gradient
    assert count_flops(load_workload("examples:mlp"), 4) == 8192
    assert estimate("examples:mlp", 4, target="cpu").flops_per_step == 8192


def test_data_dependent_model_still_gets_an_estimate_and_says_how():
    wl = str(WORKLOADS / "datadep.py")
    assert count_flops(load_workload(wl), 8) is None          # meta tensors cannot run .item(): no count, no crash
    est = estimate(wl, 8, optimizer="sgd", target="cuda", gpu="l4", search_max_batch=False)
    assert est.method != "fake-trace" and est.peak_allocated_bytes > 0 and est.fits


def test_mixture_of_experts_grouped_gemms_are_traced_and_counted(tmp_path):
    """transformers' experts run torch._grouped_mm. Under autocast with fp32 master weights the tokens are cast
    to fp32 and CUDA runs its per-group fallback, which torch's bf16-only meta kernel refused; and torch has
    no FLOP formula for the op. Both precisions now trace, with the experts' FLOPs, the same in each."""
    import json

    h, i, experts, top_k, layers = 256, 512, 8, 2, 2
    config = tmp_path / "mixtral.json"
    config.write_text(json.dumps({
        "model_type": "mixtral", "vocab_size": 128, "hidden_size": h, "intermediate_size": i,
        "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 64, "num_local_experts": experts, "num_experts_per_tok": top_k,
        "tie_word_embeddings": False}))
    tokens = 2 * 32
    # each routed token: gate and up (h -> i) and down (i -> h); forward 2 FLOPs per weight, backward 4
    experts_flops = 6 * tokens * top_k * 3 * h * i * layers
    mixed = estimate(str(config), 2, precision="bf16", seq_len=32, gpu="H100", search_max_batch=False)
    pure = estimate(str(config), 2, precision="bf16-pure", seq_len=32, gpu="H100", search_max_batch=False)
    assert mixed.flops_per_step == pure.flops_per_step > experts_flops
    gemms = mixed.trace.op_costs.gemms
    assert any(key[1] == experts and key[0] == "forward" for key in gemms)  # one call: the experts as a batch
