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


def test_4bit_weights_as_bitsandbytes_stores_them():
    pytest.importorskip("bitsandbytes")
    vocab = 128   # tests/workloads/_hf.py VOCAB
    bf16 = estimate_inference(LLAMA, 2, new_tokens=2, dtype="bf16")
    nf4 = estimate_inference(LLAMA, 2, new_tokens=2, dtype="bf16", quantize="nf4")
    head_too = estimate_inference(LLAMA, 2, new_tokens=2, dtype="bf16", quantize="nf4", loader="lightning")
    # every linear weight but the head packed two per byte (its absmax are buffers); the head as bf16 or 4-bit
    linear = 2 * (64 * 64 * 2 + 64 * 32 * 2 + 128 * 64 * 3)
    assert nf4.parameters_bytes == bf16.parameters_bytes - 2 * linear + linear // 2
    assert head_too.parameters_bytes == nf4.parameters_bytes - 2 * vocab * 64 + vocab * 64 // 2
    assert "nf4" in nf4.notes[0] and "head in bf16" in nf4.notes[0] and "head too" in head_too.notes[0]


def test_old_bitsandbytes_dequantizes_a_multi_token_prefill():
    pytest.importorskip("bitsandbytes")
    new = estimate_inference(LLAMA, 2, new_tokens=2, dtype="bf16", quantize="nf4")
    assert not any("dequantize_4bit" in e.op for e in new.trace.events)
    dequantized = []
    for batch in (1, 2):
        old = estimate_inference(LLAMA, batch, new_tokens=2, dtype="bf16", quantize="nf4", bnb_version="0.42.0")
        dequantized.append(sum("dequantize_4bit" in e.op for e in old.trace.events if e.action == "alloc"))
    # a bf16 copy per linear layer (2 layers x 7) in every multi-row matmul: batch 1's prefill only (its
    # 1-token decode steps take the GEMV), batch 2's prefill and both decode steps
    assert dequantized == [14, 42]
    # Lightning Fabric (litgpt) quantizes the head too, from float16: with every position's logits the head's
    # matmul is multi-row too, and each dequantized fp16 weight is cast to the bf16 compute dtype
    fabric = estimate_inference(LLAMA, 1, new_tokens=2, dtype="bf16", quantize="nf4", bnb_version="0.42.0",
                                loader="lightning", prefill_logits="all")
    allocs = [e for e in fabric.trace.events if e.action == "alloc"]
    assert sum("dequantize_4bit" in e.op for e in allocs) == 15
    assert sum(e.op == "aten._to_copy" and e.nbytes == 2 * 128 * 64 for e in allocs) >= 1   # the head, in bf16


def test_prefill_logits_all_keeps_every_position():
    last = estimate_inference(LLAMA, 2, new_tokens=0, dtype="fp32", target="cpu")
    every = estimate_inference(LLAMA, 2, new_tokens=0, dtype="fp32", target="cpu", prefill_logits="all")
    logits = [max(e.nbytes for e in est.trace.events if e.action == "alloc" and e.module == "lm_head")
              for est in (last, every)]
    assert logits == [2 * 1 * 128 * 4, 2 * 16 * 128 * 4]   # batch x positions x vocab x fp32


def test_fp4_with_double_quantization_from_the_cli(capsys):
    # litgpt's --quantize bnb.fp4-dq (tutorials/quantize.md): fp4 packs like nf4, and double quantization
    # stores its absmax (buffers, in the peak) as nf4-dq does
    pytest.importorskip("bitsandbytes")

    def run(quant):
        assert main(["estimate", LLAMA, "-b", "1", "--inference", "--new-tokens", "1", "--precision", "bf16",
                     "--quantize", quant, "--json", "--no-max-batch"]) == 0
        d = json.loads(capsys.readouterr().out)
        assert f"bitsandbytes {quant} " in d["notes"][0]
        return d["peak_allocated_bytes"]

    assert run("fp4-dq") == run("nf4-dq") != run("fp4") == run("nf4")


def test_bf16_mixed_generation_holds_a_bf16_copy_of_every_linear_weight():
    # litgpt generate --precision bf16-mixed: fp32 weights, each forward under autocast, whose cache keeps a
    # bf16 copy of each fp32 weight it casts (they require grad) until the forward returns
    pure = estimate_inference(LLAMA, 1, new_tokens=2, dtype="fp32", target="cpu")
    mixed = estimate_inference(LLAMA, 1, new_tokens=2, dtype="bf16", weights="fp32", target="cpu")
    linear = 2 * (64 * 64 * 2 + 64 * 32 * 2 + 128 * 64 * 3) + 128 * 64   # the layers' and the head's weights
    assert mixed.parameters_bytes == pure.parameters_bytes
    assert mixed.peak_allocated_bytes >= pure.parameters_bytes + 2 * linear   # all copies alive at once
    # more than fp32 generation holds, although its activations are half the size (how much more depends on
    # the CPU's oneDNN kernels: AVX2 keeps other scratch than AMX)
    assert mixed.peak_allocated_bytes > pure.peak_allocated_bytes
    assert "autocast" in mixed.notes[0]


@pytest.mark.parametrize("argv", [["--quantize", "nf4"], ["--inference", "--quantize-by", "lightning"],
                                  ["--inference", "--qlora"], ["--prefill-logits", "all"],
                                  ["--inference", "--base-dtype", "fp32", "--quantize", "nf4"],
                                  ["--inference", "--precision", "bf16", "--base-dtype", "fp16"]])
def test_quantize_flags_refused_where_they_mean_nothing(argv, capsys):
    assert main(["estimate", LLAMA, "-b", "1", *argv]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
