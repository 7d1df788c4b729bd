"""Repeated blocks rebuilt from a 3-block trace (plan/tracing/repeat.py) equal the full-depth trace event for event;
blocks that differ anywhere in the stack are traced whole."""

import json
from collections import Counter

import pytest

from gpuwise.hf import hf_workload
from gpuwise.plan import estimate
from gpuwise.plan.memory.events import live_peak
from gpuwise.plan.tracer import trace_workload
from gpuwise.plan.tracing import alike, repeat, repeat_tags
from gpuwise.plan.tracing.modes import TrainingModes
from gpuwise.plan.tracing.repeat import canonical, rebuild, repeated_trace
from gpuwise.plan.tracing.trace import _run
from gpuwise.step import StepConfig

TINY = json.load(open("tests/data/configs/tiny-llama.json"))


def _config(tmp_path, layers: int, **extra) -> str:
    path = tmp_path / f"cfg{layers}.json"
    path.write_text(json.dumps({**TINY, "num_hidden_layers": layers, **extra}))
    return str(path)


@pytest.mark.parametrize("target,config", [
    ("cpu", StepConfig("adamw", "fp32", False)),      # for-loop AdamW: each parameter's temporaries freed late
    ("cuda", StepConfig("adamw", "bf16", False)),     # foreach AdamW, autocast, a whole warm-up step
    ("cuda", StepConfig("sgd", "bf16-pure", False)),  # parameters cast in place of the fp32 ones
])
def test_rebuilt_events_equal_the_full_depth_trace(tmp_path, target, config):
    wl = hf_workload(_config(tmp_path, 6), 16)
    rebuilt, why = repeated_trace(wl, 2, config, target)
    assert rebuilt is not None, why
    full = trace_workload(wl, 2, config, target, repeat=False)
    assert canonical(rebuilt) == canonical(full)  # every event: size, category, phase, module, op, pairing
    assert live_peak(rebuilt) == live_peak(full)  # so the peak is byte-exact, breakdown and place included
    assert rebuilt.flops_per_step == full.flops_per_step
    assert any("repeated blocks: traced with 3 and 4 of 6 blocks" in n for n in rebuilt.notes)


@pytest.mark.parametrize("extra", [
    # under autocast, when the forward's outputs die: the KV cache freed last block to first, then autocast's
    # cached casts first to last (the block-0 frees at the turn are their own run)
    {"model_type": "gpt_neox"},
    # the sliding-window KV cache's per-layer position counters, made before the blocks run and freed with
    # each layer's keys and values
    {"model_type": "mistral", "sliding_window": 4096},
    # temporaries of the blocks' weight initialisation (A_log, dt_bias), made outside any forward; a 6-block
    # model frees three of each block's 32-byte temporaries in another order than the 3- and 4-block ones
    # (the setup's order, not what is live: the steady step and the peak are compared)
    {"model_type": "mamba2", "num_heads": 8, "head_dim": 16, "expand": 2, "n_groups": 1, "state_size": 16},
    # each attention's sinusoidal positions, computed in its __init__
    {"model_type": "gptj", "n_embd": 64, "n_head": 4, "n_layer": 6, "rotary_dim": 8, "n_positions": 64},
], ids=lambda extra: extra["model_type"])
def test_storages_of_a_block_made_or_freed_outside_it_are_the_blocks(tmp_path, extra):
    """Events outside the blocks' forward and backward that still belong to one block: each family was
    traced whole (its middle block's events in no run over the blocks, or the 4-block check failing)."""
    wl = hf_workload(_config(tmp_path, 6, **extra), 16)
    config = StepConfig("adamw", "bf16", False)
    rebuilt, why = repeated_trace(wl, 2, config, "cuda")
    assert rebuilt is not None, why
    full = trace_workload(wl, 2, config, "cuda", repeat=False)
    (steady, rows), (full_steady, full_rows) = canonical(rebuilt), canonical(full)
    assert steady == full_steady and rows[steady:] == full_rows[steady:]  # the step, event for event
    if extra["model_type"] != "mamba2":
        assert rows == full_rows
    assert live_peak(rebuilt) == live_peak(full)


def test_a_first_block_unlike_the_others_is_traced_as_itself(tmp_path):
    """A dense first block before mixture-of-experts ones (GLM-4.5's first_k_dense_replace = 1): the rebuild
    keeps block 0's events and repeats the middle block's."""
    moe = {"model_type": "glm4_moe", "first_k_dense_replace": 1, "n_routed_experts": 4, "num_experts_per_tok": 2,
           "moe_intermediate_size": 32, "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "head_dim": 16}
    wl = hf_workload(_config(tmp_path, 6, **moe), 16)
    config, target = StepConfig("adamw", "bf16", False), "cuda"
    rebuilt, why = repeated_trace(wl, 2, config, target)
    assert rebuilt is not None, why
    full = trace_workload(wl, 2, config, target, repeat=False)
    assert canonical(rebuilt) == canonical(full)
    assert live_peak(rebuilt) == live_peak(full)


@pytest.mark.parametrize("config,modes", [
    (StepConfig("adamw", "bf16", False), TrainingModes(lora_rank=8)),   # adapters only train: no embedding grads
    (StepConfig("adamw", "bf16", True), TrainingModes(lora_rank=8)),    # a block's recompute meets the next's tail
    (StepConfig("adamw", "bf16", False), TrainingModes(grad_accum=4)),  # gradients accumulated at backward's end
    # autocast's cached casts of the adapters: a later micro-step casts every block's gradient at its end
    (StepConfig("adamw", "bf16", False), TrainingModes(lora_rank=8, grad_accum=2)),
    (StepConfig("adamw", "bf16", True), TrainingModes(lora_rank=8, grad_accum=2)),
])
def test_a_model_with_training_modes_is_rebuilt_as_traced_whole(tmp_path, config, modes):
    """LoRA, checkpointing under LoRA, accumulation, and both: the rebuild from the moded 3- and 4-block models
    equals the moded full-depth trace."""
    wl = hf_workload(_config(tmp_path, 6), 16)
    rebuilt = trace_workload(wl, 2, config, "cuda", repeat=True, modes=modes)  # estimate's way in
    assert any("repeated blocks: traced with 3 and 4 of 6 blocks" in n for n in rebuilt.notes), rebuilt.notes
    full = trace_workload(wl, 2, config, "cuda", repeat=False, modes=modes)
    assert canonical(rebuilt) == canonical(full)
    assert live_peak(rebuilt) == live_peak(full)


def test_a_rebuild_that_does_not_reproduce_the_4_block_trace_is_not_used(tmp_path, monkeypatch):
    t3 = _run(hf_workload(_config(tmp_path, 3), 16, num_layers=3), 2, StepConfig(), "cpu", fake=True, layers=3)
    assert canonical(rebuild(t3, 3)) == canonical(t3)  # rebuilding the traced depth changes nothing

    def shifted(trace, layers):  # a rebuild that pairs the middle block's frees one block off
        trace.layers.block_layer = {b: (None if i is None else min(i + 1, 2)) for b, i in trace.layers.block_layer.items()}
        return repeat.rebuild.__wrapped__(trace, layers)

    shifted.__wrapped__ = repeat.rebuild
    monkeypatch.setattr(repeat, "rebuild", shifted)
    rebuilt, why = repeat.repeated_trace(hf_workload(_config(tmp_path, 6), 16), 2, StepConfig(), "cpu")
    assert rebuilt is None and why


@pytest.mark.parametrize("extra,where", [
    # the last block alone uses a sliding window: the 3- and 4-block traces cannot see it
    ({"model_type": "qwen2", "layer_types": ["full_attention"] * 5 + ["sliding_attention"],
      "use_sliding_window": True, "sliding_window": 4}, "block 5 differs"),
    # a block with a different MLP (shapes differ)
    ({"model_type": "qwen2_moe", "mlp_only_layers": [4], "num_experts": 4, "num_experts_per_tok": 2,
      "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32}, "block 4 has other modules"),
])
def test_blocks_that_differ_are_traced_whole(tmp_path, extra, where):
    wl = hf_workload(_config(tmp_path, 6, **extra), 16)
    rebuilt, why = repeated_trace(wl, 2, StepConfig(), "cpu")
    assert rebuilt is None and where in why
    est = estimate(wl, 2, target="cpu")
    assert any(where in n and "traced whole" in n for n in est.notes)


@pytest.mark.parametrize("base,extra,units", [
    # Gemma-2-2B: sliding-window and global attention alternate; a cache counter for each sliding block only
    ("benchmarks/published/configs/gemma-2-2b.json", {"num_hidden_layers": 12}, repeat.Units(2, 2)),
    # gpt-oss-20b's widths: alternating attention over mixture-of-experts blocks (fewer experts, the same routing)
    ("gpt_oss", {"num_hidden_layers": 12, "num_local_experts": 4}, repeat.Units(2, 2)),
    # SmolLM3-3B: every fourth block without RoPE
    ("smollm3", {"num_hidden_layers": 24}, repeat.Units(4, 4)),
    # Gemma-3 (Gemma-3-4B's 34 blocks): five sliding-window blocks, then a global one; the first unit, blocks 0..3,
    # is shorter than a period (its storages pair with a period's last blocks'), and the global blocks' RoPE
    # tables, made outside the blocks, are freed in the backward of the lowest global block (once, not per unit)
    ("gemma3_text", {"num_hidden_layers": 34}, repeat.Units(4, 6)),
], ids=["gemma2", "gpt_oss", "smollm3", "gemma3"])
def test_blocks_whose_kinds_repeat_with_a_period_are_rebuilt_by_units_as_traced_whole(tmp_path, base, extra, units):
    """Blocks of several kinds in a repeating pattern: the rebuild's unit is a period of blocks (after a first unit
    of the blocks before the pattern, and as many more as make the rest whole periods); 3 and 4 units traced, the
    step equals the one traced whole, event for event."""
    from transformers import AutoConfig

    if base.endswith(".json"):
        cfg = json.load(open(base))
    else:  # the family's defaults, its published widths; its per-block lists made again for the new depth
        cfg = {**AutoConfig.for_model(base).to_dict(), "model_type": base, "layer_types": None, "no_rope_layers": None}
    source = tmp_path / "config.json"
    source.write_text(json.dumps({**cfg, **extra}))
    wl = hf_workload(str(source), 64)
    assert alike.block_units(wl.hf_config, wl.task, extra["num_hidden_layers"]) == units
    config = StepConfig("adamw", "bf16", False)
    rebuilt, why = repeated_trace(wl, 1, config, "cuda")
    assert rebuilt is not None, why
    assert any(n.startswith("repeated blocks: traced with 3 and 4 of ") and "units of" in n for n in rebuilt.notes)
    full = trace_workload(wl, 1, config, "cuda", repeat=False)
    (steady, rows), (full_steady, full_rows) = canonical(rebuilt), canonical(full)
    assert steady == full_steady and rows[steady:] == full_rows[steady:]  # the step, event for event
    # the set-up: the same events; Gemma-3 frees a few construction temporaries in another order (as Mamba-2 above)
    assert Counter(rows[:steady]) == Counter(full_rows[:steady])
    if base != "gemma3_text":
        assert rows == full_rows
    assert live_peak(rebuilt) == live_peak(full)
    assert rebuilt.flops_per_step == full.flops_per_step


def test_per_block_objects_made_outside_the_blocks_are_the_blocks_of_their_kind(tmp_path):
    """Gemma-3 under LoRA (peft's model keeps the cache to the end of the forward): the cache's position counter of
    each sliding-window block is made before the blocks run and freed with the others, not in a sweep over the
    blocks; made one after another, as many as the sliding blocks, they are those blocks'. Cohere2 (3:1) too."""
    from transformers import AutoConfig

    for base, layers in (("gemma3_text", 34), ("cohere2", 24)):
        cfg = {**AutoConfig.for_model(base).to_dict(), "model_type": base, "layer_types": None,
               "num_hidden_layers": layers}
        source = tmp_path / f"{base}.json"
        source.write_text(json.dumps(cfg))
        wl = hf_workload(str(source), 512 if base == "gemma3_text" else 64)
        config, modes = StepConfig("adamw", "bf16", False), TrainingModes(lora_rank=16) if base == "gemma3_text" else None
        rebuilt = trace_workload(wl, 1, config, "cuda", repeat=True, modes=modes)
        assert any(n.startswith("repeated blocks: traced with 3 and 4 of ") for n in rebuilt.notes), rebuilt.notes
        full = trace_workload(wl, 1, config, "cuda", repeat=False, modes=modes)
        (steady, rows), (full_steady, full_rows) = canonical(rebuilt), canonical(full)
        assert steady == full_steady and rows[steady:] == full_rows[steady:]
        assert Counter(rows[:steady]) == Counter(full_rows[:steady])
        assert live_peak(rebuilt) == live_peak(full)


def test_periods_are_found_after_the_blocks_before_them_and_refused_where_too_short():
    """The period of blocks' kinds, its first unit (the blocks before the repetition and the remainder of whole
    periods), at least MIN_LAYERS units; none where no period repeats."""
    assert alike._periodic([0] * 10) == repeat.Units(1, 1)
    assert alike._periodic([0, 0, 0] + [1] * 30) == repeat.Units(3, 1)          # dense blocks before MoE ones
    assert alike._periodic([0, 1] * 21) == repeat.Units(2, 2)                   # Gemma-2-9B: 42 blocks
    assert alike._periodic(([0] * 5 + [1]) * 10 + [0, 0]) == repeat.Units(2, 6)  # Gemma-3-27B: 62 blocks, 5:1
    assert alike._periodic([0, 1] * 5) is None                                  # 5 units of 2: too few
    assert alike._periodic([0] * 8 + [1] + [0] * 8) is None                     # one block unlike the others


def test_a_period_whose_small_model_is_not_the_first_blocks_is_not_used(tmp_path, monkeypatch):
    """The 3- and 4-unit models are the config built with fewer blocks: where that does not give the full model's
    first blocks (a per-block setting the count does not cut), the rebuild is not used."""
    wl = hf_workload(str(_gemma2(tmp_path)), 16)
    assert alike.block_units(wl.hf_config, wl.task, 12) == repeat.Units(2, 2)
    alike._block_units.cache_clear()
    monkeypatch.setattr(alike, "set_num_layers", lambda cfg, n: setattr(cfg, "num_hidden_layers", n) or setattr(
        cfg, "layer_types", ["full_attention"] * n))  # the small models' blocks all global
    why = alike.block_units(wl.hf_config, wl.task, 12)
    alike._block_units.cache_clear()
    assert isinstance(why, str) and "repeat every 2 after 2" in why and "not made of the first" in why


def _gemma2(tmp_path):
    path = tmp_path / "gemma2.json"
    path.write_text(json.dumps({**TINY, "model_type": "gemma2", "num_hidden_layers": 12, "sliding_window": 4,
                                "head_dim": 16}))
    return path


def test_blocks_with_buffers_are_compared(tmp_path):
    """Apertus's xIELU activation holds scalar buffers in every block: they are compared as tensors (shape,
    dtype), not taken for a module's attributes (which raised ValueError)."""
    wl = hf_workload(_config(tmp_path, 6, model_type="apertus"), 16)
    assert alike.blocks_alike(wl.hf_config, wl.task, 6) is None


def test_a_config_transformers_cannot_build_is_the_users_error_not_an_internal_one(tmp_path, monkeypatch):
    """Comparing the blocks builds the model on the meta device first; when transformers cannot build it
    (cohere_compass_text's default config: KeyError 'full_attention'), the step's own build says so."""
    import transformers

    from gpuwise.errors import GpuwiseError

    def broken(*args, **kwargs):
        raise KeyError("full_attention")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", broken)
    config = _config(tmp_path, 6, vocab_size=96)  # not a config an earlier test's comparison remembered
    with pytest.raises(GpuwiseError, match="model\\(\\) raised KeyError: 'full_attention'"):
        estimate(config, 2, target="cuda", search_max_batch=False)
    monkeypatch.undo()
    assert alike.blocks_alike(hf_workload(config, 16).hf_config, "causal-lm", 6) is None  # nothing remembered


def test_estimate_of_a_deep_config_says_it_reused_blocks(tmp_path):
    est = estimate(_config(tmp_path, 6), 2, target="cuda", search_max_batch=False)
    assert any("repeated blocks" in n for n in est.notes)
    assert est.trace is not None and est.trace.events  # a whole trace, for the charts and the breakdowns


def test_stage_progress_is_silent_for_quick_runs_then_prints_each_stage(capsys):
    from gpuwise.report.progress import StageProgress

    now = [0.0]
    progress = StageProgress("estimate", after_s=2.0, every_s=5.0, clock=lambda: now[0])
    progress("tracing 3 of 80 blocks at batch 1")
    now[0] = 1.5
    progress("tracing 4 of 80 blocks at batch 1")  # under 2 s: nothing yet
    now[0] = 2.5
    progress.tick()                                 # past 2 s: the running stage, once
    now[0] = 3.0
    progress.tick()                                 # same stage within 5 s: quiet
    progress("rebuilding 80 blocks")                # a new stage: at once
    err = capsys.readouterr().err.splitlines()
    assert err == ["estimate: tracing 4 of 80 blocks at batch 1 (2.5 s)", "estimate: rebuilding 80 blocks (3.0 s)"]


@pytest.mark.parametrize("spec,config", [
    ("tiny-llama", StepConfig("adamw", "bf16", False)),
    ("tiny-llama", StepConfig("adamw", "fp32", True)),       # checkpointed blocks
    ("tiny-llama", StepConfig("sgd", "bf16-pure", False)),
    ("examples:gpt-mini", StepConfig()),
    ("examples:resnet", StepConfig("adamw", "bf16", False)),  # batch norm buffers, convolutions
    ("tiny-llama", StepConfig("adamw", "fp16", False)),      # a GradScaler: its first step makes its scale
    ("tiny-llama", StepConfig("sgd", "fp16", True)),
])
def test_a_copied_warm_up_step_equals_a_traced_one(spec, config):
    """plan/memory/warmup.py: the CUDA target's warm-up step assembled from the steady step's events is the traced
    warm-up step, event for event (so the caching-allocator replay sees the same history)."""
    wl = hf_workload("tests/data/configs/tiny-llama.json", 16) if spec == "tiny-llama" else spec
    from gpuwise.workload import load_workload

    wl = load_workload(wl)
    copied = _run(wl, 2, config, "cuda", fake=True, warmup="copy")
    traced = _run(wl, 2, config, "cuda", fake=True, warmup="step")
    assert canonical(copied) == canonical(traced)


def test_a_first_forward_that_leaves_state_behind_gets_a_traced_warm_up(monkeypatch):
    """A storage made in the first forward and kept (a lazily built cache) would be missing from a copied
    warm-up: the copy is refused and the warm-up step traced."""
    import torch

    from gpuwise.plan.memory import warmup
    from gpuwise.workload import Workload

    class Cached(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.cache = None

        def forward(self, x):
            if self.cache is None:
                self.cache = torch.ones(64, 64)  # built on the first call, kept
            return self.lin(x)

    wl = Workload(spec="cached", model_fn=Cached, batch_fn=lambda b: torch.randn(b, 8),
                  loss_fn=lambda m, x: m(x).sum())
    refused = []
    real = warmup.warm_up_step_from_steady

    def spy(*a):
        try:
            return real(*a)
        except warmup.NotCopyable as exc:
            refused.append(str(exc))
            raise

    monkeypatch.setattr("gpuwise.plan.tracing.trace.warm_up_step_from_steady", spy)
    copied = _run(wl, 2, StepConfig(), "cuda", fake=True, warmup="copy")
    assert refused and canonical(copied) == canonical(_run(wl, 2, StepConfig(), "cuda", fake=True, warmup="step"))


def test_a_grad_scaler_step_copies_its_warm_up(monkeypatch):
    """fp16 trains with a GradScaler, whose first `scale` makes its scale and growth tracker: the CUDA target
    traces one step (the scaler's first) and assembles the warm-up step from it, those two storages made in
    the warm-up's forward as a traced warm-up step makes them; the same events, the same speed-model ops."""
    from gpuwise.plan.tracing import trace as tracer
    from gpuwise.workload import load_workload

    wl = load_workload(hf_workload("tests/data/configs/tiny-llama.json", 16))
    ran = []
    real = tracer._trace_once
    monkeypatch.setattr(tracer, "_trace_once", lambda *a, **k: ran.append(a[5]) or real(*a, **k))
    config = StepConfig("adamw", "fp16", False)
    copied = _run(wl, 2, config, "cuda", fake=True, warmup="copy")
    assert ran == ["copy"]
    traced = _run(wl, 2, config, "cuda", fake=True, warmup="step")
    assert canonical(copied) == canonical(traced)
    assert copied.op_costs == traced.op_costs and copied.flops_per_step == traced.flops_per_step


def test_the_libraries_a_trace_runs_are_quiet_and_the_users_code_is_not(caplog):
    """A trace runs transformers / peft / bitsandbytes on a stand-in CPU step: their deprecation warnings and
    notices (peft reading a deprecated transformers attribute, bitsandbytes' CPU kernels missing) say nothing
    about the user's job and are not shown; a warning from the user's own module still is."""
    import logging
    import warnings

    from gpuwise.plan.tracer import quiet_libraries

    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")  # every warning shown, as a test runner or python -W always does
        with quiet_libraries():
            warnings.warn_explicit("deprecated", FutureWarning, "peft_model.py", 1, module="peft.peft_model")
            warnings.warn_explicit("deprecated", DeprecationWarning, "x.py", 1, module="transformers.modeling_utils")
            warnings.warn_explicit("mine", FutureWarning, "train.py", 1, module="train")
            logging.getLogger("bitsandbytes.backends.cpu.ops").warning("Failed to load CPU gemm_4bit_forward")
            logging.getLogger("user").warning("the user's notice")
    assert [str(w.message) for w in shown] == ["mine"]
    assert [r.getMessage() for r in caplog.records] == ["the user's notice"]
    assert logging.getLogger("bitsandbytes").level == logging.NOTSET  # restored


@pytest.mark.parametrize("source,config,modes", [
    # published widths of three families; LoRA under accumulation, full fine-tunes with and without checkpointing
    ("examples/configs/llama-2-7b.json", StepConfig("adamw", "bf16", False), TrainingModes(lora_rank=16, grad_accum=2)),
    ("benchmarks/published/configs/gemma-2b.json", StepConfig("adamw", "bf16", True), TrainingModes()),
    ("benchmarks/published/configs/phi-1_5.json", StepConfig("sgd", "fp32", False), TrainingModes(grad_accum=2)),
])
def test_another_micro_batch_rebuilt_from_its_3_block_trace_and_the_checks_residual_equals_its_checked_rebuild(
        source, config, modes):
    """fit asks a step at several micro-batches; only the first runs the 4-block check. The others, rebuilt from
    their 3-block trace and the check's residual, get what estimate's checked rebuild gets: events, FLOPs and
    every op cost the speed model prices."""
    wl = hf_workload(source, 128)
    first = trace_workload(wl, 1, config, "cuda", repeat=True, modes=modes)
    assert first.block_residual is not None and first.block_residual.micro_batch == 1
    reused = trace_workload(wl, 2, config, "cuda", repeat=True, modes=modes, residual=first.block_residual)
    assert any(n.startswith("repeated blocks: traced with 3 of") for n in reused.notes), reused.notes
    checked = trace_workload(wl, 2, config, "cuda", repeat=True, modes=modes)
    assert any(n.startswith("repeated blocks: traced with 3 and 4 of") for n in checked.notes), checked.notes
    assert canonical(reused) == canonical(checked)
    assert reused.flops_per_step == checked.flops_per_step
    for part in reused.op_costs.PARTS:
        nonzero = [{k: v for k, v in getattr(t.op_costs, part).items() if v} for t in (reused, checked)]
        assert nonzero[0] == nonzero[1], part


def test_a_residual_with_batch_sized_costs_outside_the_optimizer_is_not_reused():
    """What one more block adds beyond its middle block's tagged ops is reused at another micro-batch only where
    it is the optimizer's and zero_grad's (or counts of dispatches and launches): bytes a forward or backward op
    outside the tags moves may change with the batch."""
    from types import SimpleNamespace

    from gpuwise.plan.speed.ops import OpCosts

    def trace(**parts):
        costs, middle = OpCosts(), OpCosts()
        for part, values in parts.items():
            getattr(costs, part).update(values)
        return SimpleNamespace(op_costs=costs, middle_costs=middle, flops_per_step=0, middle_flops=0)

    three = trace()
    optimizer_only = trace(memory_bytes={("optimizer", "foreach"): 4096}, kernels={"optimizer": 1},
                           host_ops={"backward": 14})
    assert repeat.block_residual(three, optimizer_only, 1) is not None
    backward_bytes = trace(memory_bytes={"backward": 4096})
    assert repeat.block_residual(three, backward_bytes, 1) is None
    forward_gemm = trace(gemms={("forward", 1, 128, 128, 128, 2, True): 1})
    assert repeat.block_residual(three, forward_gemm, 1) is None


def test_an_attribute_of_one_block_alone_is_not_taken_for_numbering():
    """A `layer_idx` counts the blocks (left out of their kinds); an int attribute only one block has is a
    difference between blocks, whatever its value."""
    def block(i, **extra):
        return [("", "Block", ()), ("attn", "Attention", tuple(sorted({"layer_idx": i, **extra}.items())))]

    assert repeat_tags.block_kinds([block(i) for i in range(8)])[1:] == [0] * 7
    odd = [block(i, **({"window": 9} if i == 5 else {})) for i in range(8)]
    assert len(set(repeat_tags.block_kinds(odd)[1:])) == 2


def test_a_model_built_for_real_then_copied_is_rebuilt_as_traced_whole(tmp_path, init_reads_data):
    """A model whose initialisation reads data (a ViT whose truncated-normal init reads it: `init_reads_data`) is built for real and copied into fake
    tensors: the failed fake build's storages and the copy's per-tensor temporaries are not the run's (they split
    each block's run into pieces, and ViT was traced whole). At vit-base widths with 6 layers the rebuild equals
    the full-depth trace event for event."""
    path = tmp_path / "vit.json"
    path.write_text(json.dumps({"model_type": "vit", "hidden_size": 768, "num_hidden_layers": 6,
                                "num_attention_heads": 12, "intermediate_size": 3072, "image_size": 224,
                                "patch_size": 16, "num_channels": 3, "num_labels": 10}))
    wl = hf_workload(str(path))
    config = StepConfig("adamw", "bf16", False)
    rebuilt, why = repeated_trace(wl, 2, config, "cuda")
    assert rebuilt is not None, why
    full = trace_workload(wl, 2, config, "cuda", repeat=False)
    assert canonical(rebuilt) == canonical(full) and live_peak(rebuilt) == live_peak(full)
    assert any("built with real weights" in n for n in full.notes)


@pytest.mark.parametrize("cfg,config", [
    # BART-base widths: the embeddings' output is freed between the first two encoder blocks' runs; the encoder's
    # output, which every decoder block reads, has its gradient summed over their backward (the last block's first
    # sum, every other block's second)
    ({"model_type": "bart", "d_model": 768, "encoder_layers": 6, "decoder_layers": 6, "encoder_attention_heads": 12,
      "decoder_attention_heads": 12, "encoder_ffn_dim": 3072, "decoder_ffn_dim": 3072, "vocab_size": 50265},
     StepConfig("adamw", "bf16", False)),
    # t5-small widths, checkpointed: every block after the first holds the position bias the first one makes, and
    # the last holder in backward (block 1) frees it
    ({"model_type": "t5", "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_layers": 6, "num_heads": 8,
      "vocab_size": 32128}, StepConfig("adamw", "bf16", True)),
], ids=["bart-base", "t5-small-checkpointed"])
def test_an_encoder_decoder_is_rebuilt_from_both_stacks_as_traced_whole(tmp_path, cfg, config):
    """An encoder-decoder of two equally deep stacks (T5, BART: two lists of L blocks) was traced whole; block i of
    the rebuild is both stacks' i-th, and the rebuild equals the full-depth trace event for event."""
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    wl = hf_workload(str(path), 32, target_len=16)
    rebuilt, why = repeated_trace(wl, 2, config, "cuda")
    assert rebuilt is not None, why
    full = trace_workload(wl, 2, config, "cuda", repeat=False)
    assert canonical(rebuilt) == canonical(full) and live_peak(rebuilt) == live_peak(full)
    assert rebuilt.flops_per_step == full.flops_per_step
    assert any("traced with 3 and 4 of 6 blocks" in n for n in rebuilt.notes)


def test_an_encoder_decoder_is_cut_in_both_stacks_when_they_are_one_depth():
    """`set_num_layers` (the small models' depth): a decoder as deep as the encoder follows it; another keeps its own."""
    from transformers import BartConfig, T5Config

    from gpuwise.hf import set_num_layers

    t5, uneven, bart = T5Config(num_layers=6), T5Config(num_layers=6, num_decoder_layers=4), BartConfig()
    for cfg in (t5, uneven, bart):
        set_num_layers(cfg, 3)
    assert (t5.num_layers, t5.num_decoder_layers) == (3, 3)
    assert (uneven.num_layers, uneven.num_decoder_layers) == (3, 4)
    assert (bart.encoder_layers, bart.decoder_layers) == (3, 3)


def test_a_vision_language_model_is_rebuilt_from_its_text_stack(tmp_path):
    """A composite config (Gemma 3: a SigLIP vision tower beside a Gemma-3 decoder) says its depth in its text
    config only: its blocks were "no repeated blocks" and every Gemma-3, LLaVA-like or Llama-4 model was traced
    whole. The text model's blocks are the deep stack (`hf.stack_config`): cut in the small models, the vision
    tower kept whole (outside the blocks; a text step does not run it). At Gemma-3-4B's widths (6 decoder blocks,
    the vision tower's 27), the rebuild equals the full-depth trace event for event."""
    from gpuwise.hf import num_layers_of, set_num_layers

    text = {"hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 6, "num_attention_heads": 8,
            "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 262208, "sliding_window": 1024,
            "layer_types": ["sliding_attention"] * 6}
    vision = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16,
              "image_size": 896, "patch_size": 14, "vision_use_head": False}
    path = tmp_path / "gemma3.json"
    path.write_text(json.dumps({"model_type": "gemma3", "text_config": text, "vision_config": vision,
                                "mm_tokens_per_image": 256}))
    wl = hf_workload(str(path), 256)
    assert num_layers_of(wl.hf_config) == 6
    small = hf_workload(str(path), 256, num_layers=3).hf_config
    assert (small.text_config.num_hidden_layers, len(small.text_config.layer_types)) == (3, 3)
    assert small.vision_config.num_hidden_layers == 27
    config = StepConfig("adamw", "bf16", False)
    rebuilt, why = repeated_trace(wl, 1, config, "cuda")
    assert rebuilt is not None, why
    full = trace_workload(wl, 1, config, "cuda", repeat=False)
    assert canonical(rebuilt) == canonical(full) and live_peak(rebuilt) == live_peak(full)
    set_num_layers(wl.hf_config, 4)
    assert wl.hf_config.text_config.num_hidden_layers == 4 and wl.hf_config.vision_config.num_hidden_layers == 27


def test_the_largest_batch_search_checks_the_blocks_once(tmp_path, monkeypatch):
    """estimate's largest-batch search rebuilds a deep model's step at its other batches from their 3-block traces,
    the blocks checked once, at -b (its 4-block trace; as fit's searches do): the same capacity, every point's
    bytes included, as checking at every batch, with one 4-block trace instead of one per batch."""
    traced = []
    small = repeat.small_trace
    monkeypatch.setattr(repeat, "small_trace", lambda wl, n, *a, **k: traced.append(n) or small(wl, n, *a, **k))
    source = _config(tmp_path, 6)
    kw = {"seq_len": 256, "precision": "bf16", "gpu": "2GiB"}
    once = estimate(source, 4, **kw)
    checked_once = Counter(traced)
    traced.clear()
    monkeypatch.setattr(repeat, "block_residual", lambda *a: None)  # no residual to reuse: every batch checked
    every = estimate(source, 4, **kw)
    assert every.capacity.to_dict() == once.capacity.to_dict() and once.capacity.settled
    points = len(once.capacity.to_dict()["points"])  # -b's and the search's, each traced
    assert points >= 3
    assert checked_once == {3: points, 4: 1} and Counter(traced) == {3: points, 4: points}
