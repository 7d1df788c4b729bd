"""--cross-entropy: a causal LM's loss traced as torchtune's chunked loss and Liger's fused linear cross-entropy
compute it (plan/tracing/losses.py): the same loss and gradients as the model's own on real tensors, and on a
fake trace at Llama-3-8B's widths the buffers those libraries allocate instead of the float32 logits."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from gpuwise.errors import GpuwiseError  # noqa: E402
from gpuwise.plan.tracing.losses import causal_lm_loss  # noqa: E402

KINDS = ("fused", "chunked", "fused-linear")


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_each_loss_gives_the_models_own_loss_and_gradients(family):
    """On real CPU tensors: the loss value and every parameter's gradient match the model's own loss (ForCausalLMLoss)
    within float32 rounding; Gemma 2 caps its logits (final_logit_softcapping), which both losses apply."""
    common = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16)
    cfg = (transformers.LlamaConfig(**common) if family == "llama"
           else transformers.Gemma2Config(**common, final_logit_softcapping=30.0, attn_logit_softcapping=None))
    assert family == "llama" or cfg.final_logit_softcapping == 30.0
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    model.train()
    ids = torch.randint(0, 1000, (3, 37))  # 111 tokens: Liger's chunks (16 rows) do not divide them
    batch = {"input_ids": ids, "labels": ids}
    own = model(**batch).loss
    own.backward()
    expected = _grads(model)
    for kind in KINDS:
        model.zero_grad(set_to_none=True)
        loss = causal_lm_loss(kind, "tiny", cfg)(model, batch)
        loss.backward()
        got = _grads(model)
        assert got.keys() == expected.keys()
        assert loss.item() == pytest.approx(own.item(), rel=1e-5), kind
        for name, g in got.items():
            torch.testing.assert_close(g, expected[name], rtol=1e-4, atol=1e-6, msg=f"{kind}: {name}")


@pytest.fixture(scope="module")
def llama3_widths(tmp_path_factory):
    """Llama-3.1-8B's widths (4096 wide, 14336 MLP, 32/8 heads, 128256 vocabulary), two blocks: the head's logits
    are the step's largest tensors."""
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
           "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 2,
           "vocab_size": 128256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
           "tie_word_embeddings": False}
    path = tmp_path_factory.mktemp("llama3") / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def _traced(path, kind, **kw):
    from gpuwise.plan import estimate

    return estimate(path, 1, precision="bf16", seq_len=2048, gpu="H100", search_max_batch=False, lora=16,
                    cross_entropy=kind, **kw)


def _allocs(est):
    return [e for e in est.trace.events[est.trace.steady_start:] if e.action == "alloc"]


@pytest.fixture(scope="module")
def traced(llama3_widths):
    return {kind: _traced(llama3_widths, kind) for kind in ("model",) + KINDS}


def test_the_fused_linear_loss_allocates_liger_buffers_not_the_logits(traced):
    """LoRA on Llama-3-8B widths, 2048 tokens, bf16 on an H100. The model's own loss makes the float32 logits
    (2048 x 128256 x 4 bytes); Liger's never does: its largest loss buffers are the head's gradient-sized
    `grad_weight` only where the head trains (here it is frozen: none), a chunk of next_power_of_2(2048 / 32) = 64
    tokens' bf16 logits, and the input's gradient (2048 x 4096)."""
    tokens, vocab, hidden = 2048, 128256, 4096
    fp32_logits = tokens * vocab * 4
    own = _allocs(traced["model"])
    fused = _allocs(traced["fused-linear"])
    assert any(e.nbytes == fp32_logits for e in own)
    assert not any(e.nbytes >= tokens * vocab * 2 for e in fused)
    assert any(e.nbytes == 64 * vocab * 2 for e in fused)       # one chunk's logits
    assert not any(e.nbytes == vocab * hidden * 4 for e in fused)  # the head is frozen: no grad_weight
    saved = traced["model"].peak_allocated_bytes - traced["fused-linear"].peak_allocated_bytes
    assert saved > fp32_logits  # at least the float32 logits (and their gradient) are gone from the peak


def test_the_chunked_loss_upcasts_one_chunk_at_a_time(traced):
    """torchtune's chunked loss keeps the head's bf16 logits in 8 chunks (256 tokens each) and upcasts one chunk
    at a time: float32 chunks of 256 x 128256, no float32 copy of all 2048 tokens' logits; its peak lies between
    the model's own and Liger's."""
    tokens, vocab = 2048, 128256
    chunked = _allocs(traced["chunked"])
    assert any(e.nbytes == tokens // 8 * vocab * 2 for e in chunked)
    assert any(e.nbytes == tokens // 8 * vocab * 4 for e in chunked)
    assert not any(e.nbytes == tokens * vocab * 4 for e in chunked)
    peaks = {k: t.peak_allocated_bytes for k, t in traced.items()}
    assert peaks["fused-linear"] < peaks["chunked"] < peaks["model"]


def test_the_fused_loss_keeps_the_16_bit_logits_and_makes_their_gradient(traced):
    """flash-attn's loss (llm-foundry's default): the model's bf16 logits, kept for the backward, which makes
    their bf16 gradient; float32 rows of loss and log-sum-exp, no float32 logits."""
    tokens, vocab = 2048, 128256
    fused = _allocs(traced["fused"])
    assert not any(e.nbytes == tokens * vocab * 4 for e in fused)
    assert sum(e.nbytes == tokens * vocab * 2 and e.phase == "forward" for e in fused) == 1   # the logits
    assert sum(e.nbytes == tokens * vocab * 2 and e.phase == "backward" for e in fused) >= 1  # their gradient
    assert sum(e.nbytes == tokens * 4 and e.op == "gpuwise.xentropy_fwd" for e in fused) == 2
    assert traced["fused"].peak_allocated_bytes < traced["model"].peak_allocated_bytes


@pytest.mark.parametrize("kind", ["model", "fused"])
def test_training_metrics_run_after_the_backward_and_change_nothing_it_computes(kind):
    """--train-metrics (Composer's train metrics): N sum-reduced cross-entropies over the step's logits, run once
    the backward has finished (its last op, the embedding's gradient, comes before them), no_grad; the loss and
    the gradients are the same as without them."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    ids = torch.randint(0, 1000, (2, 33))
    batch = {"input_ids": ids, "labels": ids}
    plain = causal_lm_loss(kind, "tiny", cfg)(model, batch)
    plain.backward()
    expected = _grads(model)
    model.zero_grad(set_to_none=True)
    with Log() as log:
        loss = causal_lm_loss(kind, "tiny", cfg, train_metrics=2)(model, batch)
        forward_ops = len(log.ops)
        loss.backward()
    assert loss.item() == plain.item()
    for name, g in _grads(model).items():
        torch.testing.assert_close(g, expected[name], rtol=0, atol=0, msg=name)
    after = log.ops[forward_ops:]
    last_backward = max(i for i, op in enumerate(after) if op == "aten.embedding_dense_backward")
    assert after[last_backward + 1:].count("aten.nll_loss_forward") == 2
    assert after[:last_backward].count("aten.nll_loss_forward") == 0


def test_training_metrics_hold_the_logits_through_the_backward_and_upcast_them(llama3_widths):
    """At Llama 3's widths in bf16 on an H100 with flash-attn's loss: each metric makes the log-softmax of the
    bf16 logits and its float32 copy for nll_loss (CUDA's autocast policy of the installed torch), after the
    backward and in no module; the logits live until then, where the plain loss frees them when its backward
    has run. The predicted step is slower by about those bytes' traffic, and only in its memory-bound part."""
    tokens, vocab = 2048, 128256
    plain = _traced(llama3_widths, "fused")
    metered = _traced(llama3_widths, "fused", train_metrics=2)
    fp32 = [e for e in _allocs(metered) if e.nbytes == tokens * vocab * 4]
    assert len(fp32) == 2 and {(e.phase, e.module) for e in fp32} == {("backward", "")}
    assert not any(e.nbytes == tokens * vocab * 4 for e in _allocs(plain))

    def logits_freed_after(est):  # events after the forward's logits were freed
        steady = est.trace.events[est.trace.steady_start:]
        logits = next(e.block for e in steady if e.action == "alloc" and e.phase == "forward"
                      and e.nbytes == tokens * vocab * 2)
        return len(steady) - next(i for i, e in enumerate(steady) if e.action == "free" and e.block == logits)

    last_metric = max(i for i, e in enumerate(metered.trace.events) if e.nbytes == tokens * vocab * 4)
    assert len(metered.trace.events) - last_metric > logits_freed_after(metered)  # freed after the metrics
    assert logits_freed_after(plain) > logits_freed_after(metered)
    extra = {k: metered.speed.breakdown[k] - plain.speed.breakdown[k] for k in plain.speed.breakdown}
    traffic = 2 * tokens * vocab * (2 + 2 + 2 + 4)  # per metric: log-softmax read and written, float32 copy
    assert extra["memory_bound"] > 0.5 * traffic / 4.8e12
    assert all(abs(v) < 1e-3 * extra["memory_bound"] for k, v in extra.items() if k not in ("memory_bound",
                                                                                            "launch_overhead"))


def test_training_metrics_take_cudas_autocast_policy_in_a_step_without_autocast(llama3_widths):
    """FSDP with bf16 parameters runs the step without autocast (--fsdp-param-dtype bf16), while Composer's
    metrics still run under the precision's autocast: CUDA's policy (log-softmax in bf16, its float32 copy for
    nll_loss), not the CPU's, after the backward and in no module."""
    from gpuwise.plan import estimate

    tokens, vocab = 2048, 128256
    est = estimate(llama3_widths, 1, seq_len=tokens, gpu="H100", search_max_batch=False, nproc=2, strategy="fsdp",
                   fsdp_param_dtype="bf16", cross_entropy="fused", train_metrics=2)
    big = [(e.op, e.nbytes, e.phase, e.module) for e in _allocs(est) if e.nbytes >= tokens * vocab * 2
           and e.op in ("aten._log_softmax", "aten._to_copy")]
    assert big == [("aten._log_softmax", tokens * vocab * 2, "backward", ""),
                   ("aten._to_copy", tokens * vocab * 4, "backward", "")] * 2


def test_training_metrics_need_the_full_logits(llama3_widths):
    from gpuwise.plan import estimate

    with pytest.raises(GpuwiseError, match="--train-metrics: computed over the model's full logits"):
        estimate(llama3_widths, 1, seq_len=128, cross_entropy="fused-linear", train_metrics=2)
    with pytest.raises(GpuwiseError, match="--train-metrics: for a model config's or Hub model's causal LM"):
        estimate("examples:gpt-mini", 2, train_metrics=2)
    with pytest.raises(GpuwiseError, match="--train-metrics must be a whole number"):
        estimate(llama3_widths, 1, seq_len=128, train_metrics=-1)


def test_a_trained_head_gets_ligers_float32_gradient_buffer(llama3_widths):
    """Full fine-tuning trains the head: Liger's `grad_weight` is zeros_like the head's fp32 weight (bf16 autocast
    keeps fp32 master weights), 128256 x 4096 x 4 bytes, accumulated in place chunk by chunk."""
    from gpuwise.plan import estimate

    est = estimate(llama3_widths, 1, precision="bf16", seq_len=512, gpu="H100", search_max_batch=False,
                   cross_entropy="fused-linear")
    assert any(e.nbytes == 128256 * 4096 * 4 and e.phase == "forward" for e in _allocs(est))


def test_the_loss_choice_is_refused_where_it_does_not_apply(tmp_path):
    from gpuwise.plan import estimate

    with pytest.raises(GpuwiseError, match="computes its own loss"):
        estimate("examples:gpt-mini", 2, cross_entropy="fused-linear")
    with pytest.raises(GpuwiseError, match="trained as seq-cls"):
        estimate("examples/configs/llama-2-7b.json", 1, task="seq-cls", cross_entropy="chunked")
    with pytest.raises(GpuwiseError, match="--cross-entropy must be one of"):
        estimate("examples/configs/llama-2-7b.json", 1, cross_entropy="liger")
    cohere = tmp_path / "config.json"
    cohere.write_text(json.dumps({"model_type": "cohere", "hidden_size": 64, "intermediate_size": 128,
                                  "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 512,
                                  "logit_scale": 0.0625}))
    with pytest.raises(GpuwiseError, match=r"logit_scale=0.0625, which fused linear cross-entropy \(Liger-Kernel.*cannot tell"):
        estimate(str(cohere), 1, cross_entropy="fused-linear")
    assert estimate(str(cohere), 1, cross_entropy="fused").peak_allocated_bytes > 0  # the model's own logits


def test_fit_options_carry_the_loss_into_their_estimate_commands():
    """Every fit option is traced with the given loss, and its estimate_cmd says it (so it reproduces the option)."""
    from gpuwise.plan.catalog import lookup
    from gpuwise.plan.fit_options import changes_of, estimate_args, train_args, variants

    options = variants(lookup("rtx4090"), 1, "fp32", None, False, cross_entropy="fused-linear")
    assert len(options) > 5 and {v.modes.cross_entropy for v in options} == {"fused-linear"}
    for v in options:
        args = estimate_args("cfg.json", "rtx4090", v, 2, 1, 5.0)
        assert args[args.index("--cross-entropy") + 1] == "fused-linear"
        assert changes_of(v, 2, 1, 1)["cross_entropy"] == "fused-linear"
        assert train_args(["cfg.json"], v, 2, 1) is None  # train runs the model's own loss
    plain = variants(lookup("rtx4090"), 1, "fp32", None, False)
    assert all("--cross-entropy" not in estimate_args("cfg.json", "rtx4090", v, 2, 1, 5.0) for v in plain)


def test_fit_options_carry_the_training_metrics_into_their_estimate_commands():
    """fit --train-metrics: every option keeps Composer's metrics (with the model's or flash-attn's loss), says so
    in its changes and estimate_cmd, and has no train_cmd; Liger's options, which make no full logits, are not
    weighed beside them."""
    from gpuwise.plan.catalog import lookup
    from gpuwise.plan.fit_options import changes_of, estimate_args, train_args, variants

    for kind in ("model", "fused"):
        options = variants(lookup("rtx4090"), 1, "fp32", None, False, cross_entropy=kind, heavy_logits=True,
                           train_metrics=2)
        assert len(options) > 5 and {(v.modes.cross_entropy, v.modes.train_metrics) for v in options} == {(kind, 2)}
        for v in options:
            args = estimate_args("cfg.json", "rtx4090", v, 2, 1, 5.0)
            assert args[args.index("--train-metrics") + 1] == "2"
            assert changes_of(v, 2, 1, 1)["train_metrics"] == 2
            assert train_args(["cfg.json"], v, 2, 1) is None  # train computes no metrics


def test_a_deep_model_with_a_fused_loss_is_rebuilt_from_its_blocks():
    """The loss runs the model's body and head itself; its modules keep the names the model's own forward gives
    them (scope.name_from), so Llama-2-7B's 32 blocks are rebuilt from 3 and 4, checked event for event."""
    from gpuwise.plan import estimate

    est = estimate("examples/configs/llama-2-7b.json", 2, precision="bf16", seq_len=256, gpu="rtx4090",
                   search_max_batch=False, lora=16, checkpointing=True, cross_entropy="fused-linear")
    assert any(n.startswith("repeated blocks: traced with 3 and 4 of 32 blocks") and "exact" in n for n in est.notes)


def test_fit_weighs_the_fused_loss_where_the_logits_are_heavy():
    """fit weighs Liger's fused linear cross-entropy (full and LoRA, with checkpointing) for a causal LM whose float32
    logits of one sample are >= 1 % of the card: Llama 3's 128k vocabulary at 2048 tokens on a 24 GB card, not
    Llama 2's 32k at 512; not when a loss was given; and running it takes liger-kernel."""
    from gpuwise.hf import hf_workload
    from gpuwise.plan.catalog import lookup
    from gpuwise.plan.fit_options import heavy_logits, needed, notes_of, variants

    card = lookup("rtx4090")
    assert heavy_logits(hf_workload("benchmarks/published/configs/llama-3.1-8b.json", 2048, "causal-lm"), card.memory_bytes)
    assert not heavy_logits(hf_workload("examples/configs/llama-2-7b.json", 512, "causal-lm"), card.memory_bytes)
    assert not heavy_logits(hf_workload("benchmarks/published/configs/llama-3.1-8b.json", 2048, "seq-cls"),
                            card.memory_bytes)
    options = variants(card, 1, "fp32", None, False, heavy_logits=True)
    liger = [v for v in options if v.modes.cross_entropy == "fused-linear"]
    assert [v.name for v in liger] == ["bf16 + checkpointing + fused linear CE",
                                       "LoRA r16 (bf16) + checkpointing + fused linear CE"]
    assert all("liger_kernel" in needed(v) for v in liger)
    assert all(v.modes.cross_entropy == "model" for v in options if v not in liger)
    assert len(options) == len(variants(card, 1, "fp32", None, False)) + 2
    assert not any(v.modes.cross_entropy == "fused-linear"
                   for v in variants(card, 1, "fp32", None, False, cross_entropy="chunked", heavy_logits=True))
    from gpuwise.plan.fit_options import NOTES
    from gpuwise.plan.point import Point

    assert NOTES["fused-linear"] in notes_of(liger[0], 1, 1, Point(0, 0))
