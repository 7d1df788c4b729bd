"""Inference memory: no-grad forward and generation with a KV cache, against the CPU profiler."""

import json

import pytest

from gpuwise.cli import main
from gpuwise.contracts import validate
from gpuwise.plan.inference import estimate_inference, measure_inference_cpu

LLAMA = "tests/workloads/hf_llama.py"   # 2 layers, 2 KV heads of 16, 16 tokens per sample
BERT = "tests/workloads/hf_bert.py"


@pytest.mark.parametrize("workload,new_tokens", [(LLAMA, 0), (LLAMA, 4), (BERT, 0)])
def test_generation_peak_matches_cpu_profiler(workload, new_tokens):
    est = estimate_inference(workload, 2, new_tokens=new_tokens, dtype="fp32", target="cpu")
    assert est.peak_allocated_bytes == measure_inference_cpu(workload, 2, new_tokens, "fp32")


def test_kv_cache_is_two_x_layers_x_batch_x_heads_x_tokens_x_dim():
    est = estimate_inference(LLAMA, 3, new_tokens=5, dtype="fp32", target="cpu")
    layers, kv_heads, head_dim, tokens = 2, 2, 16, 16 + 5
    assert est.kv_cache_bytes == 2 * layers * 3 * kv_heads * tokens * head_dim * 4
    bigger = estimate_inference(LLAMA, 6, new_tokens=5, dtype="fp32", target="cpu")
    assert bigger.kv_cache_bytes == 2 * est.kv_cache_bytes


def test_7b_inference_cli(capsys):
    assert main(["estimate", "examples/configs/llama-2-7b.json", "-b", "4", "--seq-len", "4096", "--inference",
                 "--new-tokens", "2", "--precision", "bf16", "--gpu", "H100", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    validate("estimate", d)
    assert d["kv_cache_bytes"] == 2 * 32 * 4 * 32 * (4096 + 2) * 128 * 2  # 2 x L x B x heads x T x dim x bf16
    assert d["parameters_bytes"] > 12.5 * 2**30
    assert d["device_used_bytes"] > d["parameters_bytes"] + d["kv_cache_bytes"]
