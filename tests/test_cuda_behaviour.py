"""What the CUDA target models that a CPU trace cannot see: the attention kernel each GPU runs (--attn),
the CUDA context by module loading, and the step settings of older torch versions (--optimizer-impl,
--zero-grad)."""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")

from gpuwise.errors import GpuwiseError  # noqa: E402
from gpuwise.plan import estimate  # noqa: E402
from gpuwise.plan.memory.events import MemoryTrace  # noqa: E402
from gpuwise.plan.memory.overheads import MIB, add_workspaces  # noqa: E402
from gpuwise.plan.tracing.sdpa import choose_backend  # noqa: E402

TINY_LLAMA = os.path.join(os.path.dirname(__file__), "data", "configs", "tiny-llama.json")


def _qkv(dtype=torch.float16, head_dim=64, heads=(8, 8, 8)):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        return tuple(torch.empty(2, h, 128, head_dim, dtype=dtype) for h in heads)


@pytest.mark.parametrize("cap,dtype,mask,kernel,why", [
    ((9, 0), torch.float16, False, "flash", "flash on sm90"),
    ((8, 0), torch.bfloat16, False, "flash", "flash on sm80"),
    ((7, 0), torch.float16, False, "efficient", "flash needs sm80..sm121, sm70 has none"),   # V100
    ((7, 5), torch.float16, False, "efficient", "flash needs sm80..sm121, sm75 has none"),   # T4
    ((7, 5), torch.bfloat16, False, "math", "does not run bfloat16 on sm75"),
    ((8, 0), torch.float32, False, "efficient", "flash runs fp16/bf16 only"),
    ((9, 0), torch.float16, True, "efficient", "flash takes no attention mask"),
])
def test_kernel_follows_the_gpu_dtype_and_mask(cap, dtype, mask, kernel, why):
    q, k, v = _qkv(dtype)
    attn_mask = torch.ones(128, 128, dtype=torch.bool) if mask else None
    got, reason = choose_backend(q, k, v, attn_mask, capability=cap)
    assert got == kernel
    assert why in reason


def test_flash_backward_head_dim_limit_on_sm86():
    q, k, v = _qkv(head_dim=256)
    q.requires_grad_(True)
    assert choose_backend(q, k, v, capability=(8, 6))[0] == "efficient"
    assert choose_backend(q, k, v, capability=(8, 0))[0] == "flash"


def test_a_mask_not_contiguous_in_its_rows_rules_out_the_memory_efficient_kernel():
    """torch's check_last_dim_stride_equals_1_dense: on a GPU the mask's last dimension must have stride 1.
    A relative position bias made as T5's is, (q, k, heads) permuted to (1, heads, q, k), has stride heads:
    the math kernel runs and keeps the scores (transformers 5.17 passed it so; later versions copy it)."""
    q, k, v = _qkv(torch.bfloat16)
    bias = torch.zeros(128, 128, 8).permute(2, 0, 1).unsqueeze(0)
    kernel, why = choose_backend(q, k, v, bias, capability=(9, 0))
    assert (kernel, bias.stride(-1)) == ("math", 8) and "mask's last dimension at stride 1" in why
    assert choose_backend(q, k, v, bias.contiguous(), capability=(9, 0))[0] == "efficient"
    rows = q.transpose(-1, -2).contiguous().transpose(-1, -2)  # the same values, columns contiguous
    assert choose_backend(rows, k, v, capability=(9, 0))[0] == "math"


def test_a_permuted_position_bias_keeps_the_scores_in_the_estimate(monkeypatch):
    """The rule above inside a trace: the math kernel keeps the (256, 256) scores per head, which the
    memory-efficient kernel (the same bias copied first) never holds."""
    spec = os.path.join(os.path.dirname(__file__), "workloads", "position_bias.py")
    kw = dict(precision="bf16", gpu="h100", target="cuda", search_max_batch=False)
    permuted = estimate(spec, 16, **kw)
    monkeypatch.setenv("GPUWISE_TEST_BIAS_CONTIGUOUS", "1")
    copied = estimate(spec, 16, **kw)
    assert permuted.attention["kernels"] == ["math"] and copied.attention["kernels"] == ["efficient"]
    assert any("stride 8" in w for w in permuted.attention["why"])
    scores = 16 * 8 * 256 * 256 * 2  # one bf16 (batch, heads, q, k) tensor
    assert permuted.peak_allocated_bytes - copied.peak_allocated_bytes > scores


def test_forced_flash_on_a_gpu_without_it_says_why():
    q, k, v = _qkv()
    kernel, why = choose_backend(q, k, v, capability=(7, 0), force="flash")
    assert kernel == "math" and "flash was asked for but cannot run" in why and "sm70" in why


def _tiny_bert(tmp_path):
    cfg = {"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 128, "vocab_size": 128, "max_position_embeddings": 64, "type_vocab_size": 2,
           "attention_probs_dropout_prob": 0.1, "hidden_dropout_prob": 0.1}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_attn_eager_keeps_the_scores_and_the_estimate_says_which_kernel(tmp_path):
    cfg = _tiny_bert(tmp_path)
    kw = dict(task="seq-cls", seq_len=64, batch_size=2, precision="fp16", gpu="v100-16gb", search_max_batch=False)
    eager = estimate(cfg, attn="eager", **kw)
    sdpa = estimate(cfg, attn="sdpa", **kw)
    flash = estimate(cfg, attn="flash", **kw)
    assert eager.attention["implementation"] == "eager" and eager.attention["kernels"] == []
    assert any("the (L, L) scores are kept" in n for n in eager.notes)
    assert sdpa.attention["kernels"] == ["efficient"] and sdpa.attention["compute_capability"] == "7.0"
    assert any("flash needs sm80" in w for w in sdpa.attention["why"])
    assert flash.attention["kernels"] == ["math"]  # a V100 has no flash kernel: the math path, said so
    assert any("flash was asked for but cannot run" in w for w in flash.attention["why"])
    assert eager.to_dict()["attention"]["implementation"] == "eager"
    # eager keeps the (L, L) probabilities for backward; memory-efficient attention keeps a logsumexp
    assert eager.by_category["activations"] > sdpa.by_category["activations"]
    with pytest.raises(GpuwiseError):
        estimate(cfg, attn="paged", **kw)


def test_hf_decoder_without_padding_runs_causal_flash_as_on_a_gpu(tmp_path):
    # transformers cannot read fake position ids, assumes packed sequences and would pass an explicit
    # mask (efficient kernel, full square); a real run finds no packing and calls SDPA with is_causal=True
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128, "hidden_size": 64,
           "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2}
    path = tmp_path / "llama.json"
    path.write_text(json.dumps(cfg))
    kw = dict(seq_len=64, batch_size=2, precision="bf16", gpu="a100-80gb", search_max_batch=False)
    est = estimate(str(path), attn="sdpa", **kw)
    assert est.attention["kernels"] == ["flash"]
    assert est.speed.breakdown["attention"] > 0
    triton = estimate(str(path), attn="triton", **kw)  # the same kernel's tensors, Triton's slower speed
    assert triton.attention["kernels"] == ["flash"]
    assert triton.peak_allocated_bytes == est.peak_allocated_bytes
    assert triton.speed.breakdown["attention"] > est.speed.breakdown["attention"]
    # an H100 under torch >= 2.11 runs these calls as cuDNN attention: flash's tensors, cuDNN's speed, said so
    from gpuwise.plan.speed.attention import gpu_torch

    with gpu_torch("2.11.0"):
        h100 = estimate(str(path), attn="sdpa", **{**kw, "gpu": "h100"})
    assert h100.attention["kernels"] == ["flash"] and h100.attention["priced_as"] == {"flash": "cudnn"}
    assert any(n.startswith("attention speed: torch 2.11.0 on sm90") for n in h100.notes)
    with gpu_torch("2.9.1"):
        old = estimate(str(path), attn="sdpa", **{**kw, "gpu": "h100"})
    assert "priced_as" not in old.attention and old.peak_allocated_bytes == h100.peak_allocated_bytes


def test_math_fallback_is_the_same_kernel_when_checkpointing_recomputes_it():
    # grouped-query heads with no mask on a T4: no flash (sm75), no efficient (no GQA) -> math. The recompute
    # runs in the autograd engine, outside the torch-function mode: it must run the same math kernel (it
    # ran the CPU's own SDPA kernel, and checkpointing refused the other saved tensors)
    est = estimate(TINY_LLAMA, seq_len=32, batch_size=1, gpu="T4", checkpointing=True, search_max_batch=False)
    assert est.attention["kernels"] == ["math"] and est.peak_allocated_bytes > 0


def test_kept_gradients_are_live_through_the_forward(tmp_path):
    cfg = _tiny_bert(tmp_path)
    kw = dict(task="seq-cls", seq_len=64, batch_size=2, target="cpu")
    freed = estimate(cfg, **kw)
    kept = estimate(cfg, zero_grad="zeros", **kw)
    params = freed.by_category["parameters"]
    assert kept.by_category["gradients"] >= params > freed.by_category["gradients"]
    assert kept.peak_allocated_bytes > freed.peak_allocated_bytes
    with pytest.raises(GpuwiseError):
        estimate(cfg, zero_grad="never", **kw)


def test_context_follows_cuda_module_loading():
    trace = MemoryTrace([], 0, "cuda", "fake-trace")
    _, lazy = add_workspaces(trace, "volta", env={})
    _, eager = add_workspaces(trace, "volta", env={"CUDA_MODULE_LOADING": "EAGER"})
    _, named = add_workspaces(trace, "volta", env={}, loading="eager")
    assert lazy.module_loading == "lazy" and eager.module_loading == named.module_loading == "eager"
    # Hugging Face's V100 page (2022): 1343 MiB after torch.ones((1, 1)).to("cuda"), 2 MiB of it the tensor's segment
    assert eager.context_bytes == named.context_bytes == 1341 * MIB > lazy.context_bytes


ENCODER = """
import torch
MASK = {mask!r}


def model():
    from transformers import {cls}, {cfg}
    return {cls}({cfg}({kw}))


def batch(batch_size):
    ids = torch.randint(5, 100, (batch_size, 64), generator=torch.Generator().manual_seed(batch_size))
    mask = torch.ones_like(ids)
    if MASK == "padded":
        mask[0, 48:] = 0
    out = {{"input_ids": ids, "labels": ids}}
    if MASK != "none":
        out["attention_mask"] = mask
    return out
"""
ENCODERS = {
    "roberta": ("RobertaForMaskedLM", "RobertaConfig",
                "vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, "
                "max_position_embeddings=80"),
    "distilbert": ("DistilBertForMaskedLM", "DistilBertConfig",
                   "vocab_size=128, dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=64"),
}


@pytest.mark.parametrize("arch", sorted(ENCODERS))
def test_an_all_ones_attention_mask_is_dropped_as_transformers_does_on_a_gpu(tmp_path, arch):
    # transformers' sdpa_mask drops a padding mask with no padding (padding_mask.all()), so SDPA gets no mask
    # and picks flash in bf16 on sm90; on a fake tensor it cannot read the mask and kept it (efficient kernel
    # with a (B, 1, L, S) bias: BERT-base bf16 under-predicted on the H100 truth). Padding keeps the mask.
    pytest.importorskip("transformers")
    cls, cfg, kw = ENCODERS[arch]
    ests = {}
    for mask in ("none", "ones", "padded"):
        path = tmp_path / f"{arch}_{mask}.py"
        path.write_text(ENCODER.format(mask=mask, cls=cls, cfg=cfg, kw=kw))
        ests[mask] = estimate(str(path), 4, optimizer="sgd", precision="bf16", gpu="NVIDIA H100 80GB HBM3",
                              search_max_batch=False)
    assert ests["none"].attention["kernels"] == ests["ones"].attention["kernels"] == ["flash"]
    assert ests["padded"].attention["kernels"] == ["efficient"]
    assert any("flash takes no attention mask" in w for w in ests["padded"].attention["why"])
    # the all-ones mask costs only its own few bytes (the bool copy transformers makes), not a bias
    assert abs(ests["ones"].peak_allocated_bytes - ests["none"].peak_allocated_bytes) <= 64 * 1024
    assert ests["padded"].peak_allocated_bytes > ests["ones"].peak_allocated_bytes


def test_dropout_saves_a_bool_mask_as_on_cuda():
    # aten's dropout takes the fused native_dropout on a CUDA input (a bool mask saved, 1 byte an element);
    # on a CPU tensor it saved a noise tensor of the input's dtype (4 bytes in fp32): BERT-base and GPT-2
    # small (dropout 0.1) were 3-6% over in fp32 on the H100 truth, within 0.15% once the mask is bool
    from gpuwise.plan.tracing.setup import dropout_as_cuda_runs_it

    x = torch.randn(4, 8, requires_grad=True)
    with dropout_as_cuda_runs_it():
        y = torch.nn.functional.dropout(x, 0.1, training=True)
        same = torch.nn.functional.dropout(x, 0.1, training=False)
        inplace = torch.nn.functional.dropout(x.clone(), 0.1, training=True, inplace=True)
    assert type(y.grad_fn).__name__ == "NativeDropoutBackward0"
    assert y.grad_fn._saved_result1.dtype == torch.bool
    assert same is x and type(inplace.grad_fn).__name__ != "NativeDropoutBackward0"  # CUDA's in-place: noise
    assert torch.nn.functional.dropout.__name__ == "dropout" and "setup" not in torch.nn.functional.dropout.__module__
