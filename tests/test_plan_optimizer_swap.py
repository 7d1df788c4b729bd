"""Another optimizer as a transform of a traced step (plan/tracing/optimizer_swap.py): the step traced with AdamW,
its optimizer's steps swapped for another's traced alone, is that optimizer's own trace, event for event."""

import json

import pytest

from gpuwise.plan.memory.cuda import cuda_memory
from gpuwise.plan.memory.split import Split
from gpuwise.plan.scaled import Evaluator
from gpuwise.plan.tracer import trace_optimizer_steps, trace_workload, with_optimizer
from gpuwise.plan.tracing.modes import TrainingModes
from gpuwise.plan.tracing.optimizer_swap import _shape
from gpuwise.step import StepConfig

TINY = "tests/data/configs/tiny-llama.json"
LLAMA_1B = "examples/configs/llama-3.2-1b.json"


def _deep(tmp_path, layers: int = 6) -> str:
    path = tmp_path / f"tiny{layers}.json"
    path.write_text(json.dumps({**json.load(open(TINY)), "num_hidden_layers": layers}))
    return str(path)


def _swapped(source, batch, config, modes, base="adamw", repeat=True):
    from dataclasses import replace

    own_config = replace(config, optimizer=base)
    traced = trace_workload(source, batch, own_config, "cuda", repeat, modes=modes)
    own = trace_optimizer_steps(source, own_config, "cuda", modes=modes)
    other = trace_optimizer_steps(source, config, "cuda", modes=modes)
    return traced, with_optimizer(traced, own, other, config.optimizer, base)


def _same_step(swapped, direct, setup=True):
    """The same events (`setup=False`: those of the warm-up and steady steps; a rebuild of Llama-3's RoPE set-up frees a few
    128-byte temporaries in another order than the model traced whole does, whatever the optimizer)."""
    if setup:
        assert _shape(swapped.events) == _shape(direct.events)
    else:
        assert _shape([e for e in swapped.events if e.phase != "setup"]) == \
            _shape([e for e in direct.events if e.phase != "setup"])
        assert len(swapped.events) == len(direct.events)
    assert swapped.steady_start == direct.steady_start
    assert swapped.flops_per_step == direct.flops_per_step
    assert cuda_memory(swapped, "hopper").device_used_bytes == cuda_memory(direct, "hopper").device_used_bytes


def _same_ops(swapped, direct):
    """The speed model's ops of two whole traces: the same, but for device queries (prim.device, no kernel) that
    bitsandbytes' step makes on gradients autograd made. (A rebuilt step's op counts are its 3- and 4-block traces'
    extrapolated, which foreach kernels' launches per tensor chunk are not exactly: compared on whole traces.)"""
    diff = swapped.op_costs.added(direct.op_costs, -1)
    for part in diff.PARTS:
        assert all(v == pytest.approx(0, abs=1e-6) for v in getattr(diff, part).values() if part != "host_ops"), part


@pytest.mark.parametrize("optimizer,precision,checkpointing,modes", [
    ("adafactor", "bf16", True, TrainingModes()),          # per-parameter loop; its own 4-block check fails
    ("adamw8bit", "bf16", False, TrainingModes()),         # quantization tables made with the optimizer
    ("adagrad", "fp32", False, TrainingModes()),           # state made by the constructor
    ("momentum", "fp16", False, TrainingModes()),          # a GradScaler around the optimizer's step
    ("adafactor", "bf16", False, TrainingModes(lora_rank=4)),  # only the adapters train
    ("sgd", "bf16-pure", False, TrainingModes(grad_accum=2)),  # no state at all
])
def test_a_step_with_another_optimizer_swapped_in_is_that_optimizers_trace(tmp_path, optimizer, precision,
                                                                          checkpointing, modes):
    source = _deep(tmp_path)
    config = StepConfig(optimizer, precision, checkpointing)
    traced, swapped = _swapped(source, 2, config, modes)
    assert swapped is not None
    assert any(n.startswith(f"optimizer: {optimizer}'s steps traced alone") for n in swapped.notes)
    assert "repeated blocks: traced with 3 and 4" in " ".join(traced.notes)  # AdamW's step, rebuilt
    direct = trace_workload(source, 2, config, "cuda", False, modes=modes)  # traced whole
    _same_step(swapped, direct, setup=False)
    _, whole = _swapped(source, 2, config, modes, repeat=False)
    _same_step(whole, direct)
    _same_ops(whole, direct)


def test_the_swap_at_a_published_width_gives_the_bytes_estimate_traces_whole():
    """Llama-3.2-1B's widths (16 blocks): AdamW's step rebuilt from 3 and 4 blocks, Adafactor's steps on the
    whole model swapped in, is Adafactor's step traced whole (its own 4-block check fails); estimate gives it so."""
    from gpuwise.hf import hf_workload
    from gpuwise.plan import estimate

    source = hf_workload(LLAMA_1B, 64)
    config = StepConfig("adafactor", "bf16", True)
    traced, swapped = _swapped(source, 1, config, TrainingModes())
    direct = trace_workload(source, 1, config, "cuda", False, modes=TrainingModes())
    _same_step(swapped, direct, setup=False)
    est = estimate(source, 1, "adafactor", "bf16", checkpointing=True, search_max_batch=False)
    assert any(n.startswith("optimizer: adafactor's steps traced alone") for n in est.notes), est.notes
    assert any(n.startswith("adafactor's own step: repeated blocks not reused") for n in est.notes)
    assert est.device_used_bytes == cuda_memory(direct, "hopper").device_used_bytes


def test_a_swap_whose_steps_are_not_in_the_trace_is_refused(tmp_path):
    source = _deep(tmp_path)
    config = StepConfig("adamw", "bf16", False)
    traced = trace_workload(source, 2, config, "cuda", True)
    adafactor = trace_optimizer_steps(source, StepConfig("adafactor", "bf16", False), "cuda")
    sgd = trace_optimizer_steps(source, StepConfig("sgd", "bf16", False), "cuda")
    assert with_optimizer(traced, adafactor, sgd, "sgd", "adafactor") is None  # not AdamW's trace
    assert with_optimizer(traced, sgd, adafactor, "adafactor", "sgd") is None  # SGD makes nothing to find
    pure = trace_optimizer_steps(source, StepConfig("adamw", "bf16-pure", False), "cuda")
    assert with_optimizer(traced, pure, adafactor, "adafactor", "adamw") is None  # bf16 state is not fp32 state


def test_fit_weighs_another_optimizer_without_tracing_its_step(tmp_path):
    """The Evaluator traces AdamW's step for Adafactor's and swaps: Adafactor's step costs no step trace where
    AdamW's is kept, and is exact where extrapolation stood before; where the swap's check fails it is traced
    itself (tests/test_plan_fit.py: extrapolated, and said so)."""
    from gpuwise.plan import estimate

    ev = Evaluator(_deep(tmp_path), "hopper")
    adamw, adafactor, modes = StepConfig("adamw", "bf16", False), StepConfig("adafactor", "bf16", False), TrainingModes()
    swap_note = "optimizer: adafactor's steps traced alone"
    ev.evaluate(2, adamw, modes, Split())
    assert ev.traces_run == 2 and ev.traced(2, adafactor, modes, Split()) is True
    point = ev.evaluate(2, adafactor, modes, Split())
    assert ev.traces_run == 2
    assert any(n.startswith(swap_note) for n in point.notes), point.notes
    whole = ev._point(ev.trace(None, 2, adafactor, modes), modes, Split(), point.block_param_bytes)
    assert point.device_used_bytes == whole.device_used_bytes  # Adafactor's step traced whole (one more trace)
    assert ev.traces_run == 3
    est = estimate(_deep(tmp_path), 2, "adafactor", "bf16", search_max_batch=False)  # estimate swaps too
    assert point.device_used_bytes == est.device_used_bytes
    # asked at other micro-batches (fit's rounds, side by side in forks): AdamW's steps are traced, one trace each
    # (their 3-block one: checked at 2), not Adafactor's; AdamW's option asks for them too
    assert ev.traced(4, adafactor, modes, Split()) is False
    ev.prefetch([(m, c, modes, Split()) for m in (4, 6) for c in (adamw, adafactor)], workers=2)
    assert ev.traces_run == 5
    for m in (4, 6):
        assert ev.traced(m, adafactor, modes, Split()) is True and ev.traced(m, adamw, modes, Split()) is True
        assert any(n.startswith(swap_note) for n in ev.evaluate(m, adafactor, modes, Split()).notes)
    ev.evaluate(8, adafactor, modes, Split())  # asked alone, in the parent: AdamW's step traced here
    assert ev.traces_run == 6 and ev.traced(8, adamw, modes, Split()) is True


def test_estimate_traces_the_step_whole_where_the_swap_cannot_run(tmp_path, monkeypatch):
    """Adafactor's own blocks are not reused; where its steps cannot be traced alone, estimate traces the step
    whole, as before the swap existed (the same bytes as the swap gives)."""
    from gpuwise.plan import estimate, tracer

    swapped = estimate(_deep(tmp_path), 2, "adafactor", "bf16", search_max_batch=False)
    assert any(n.startswith("optimizer: adafactor's steps traced alone") for n in swapped.notes)

    def fails(*a, **k):
        raise RuntimeError("no optimizer steps here")

    monkeypatch.setattr(tracer, "trace_optimizer_steps", fails)
    monkeypatch.setattr(tracer, "_STEPS", {})
    whole = estimate(_deep(tmp_path), 2, "adafactor", "bf16", search_max_batch=False)
    assert any(n.startswith("traced whole: repeated blocks not reused") for n in whole.notes), whole.notes
    assert whole.device_used_bytes == swapped.device_used_bytes
