"""The plan's tracer: fake-tensor steps against the profiler-measured CPU peak, categories, phases,
precision, checkpointing, the CUDA target's attention, FLOPs, the fallback and bad input."""

from __future__ import annotations

import os

import pytest
import torch

from gpuwise.errors import GpuwiseError
from gpuwise.plan.memory.events import CATEGORIES, PHASES, live_peak
from gpuwise.plan.tracing import kernels
from gpuwise.plan.tracing.cpu_truth import measure_cpu_peak
from gpuwise.plan.tracing.trace import trace_step
from gpuwise.step import StepConfig
from gpuwise.workload import load_workload

HERE = os.path.dirname(__file__)


def wl(name: str) -> str:
    return os.path.join(HERE, "workloads", name)


# (workload, batch size, non-default optimizer): eight `transformers` and recurrent architectures
# plus the bundled examples, each with the default optimizer (AdamW) and one other (gpt-mini, the
# largest example, is in benchmarks/plan_cpu_accuracy.py to keep this file fast).
ACCURACY = [
    (wl("hf_gpt2.py"), 2, "sgd"),       # decoder
    (wl("hf_llama.py"), 2, "momentum"),  # decoder: RoPE, RMSNorm, SwiGLU, grouped-query attention
    (wl("hf_bert.py"), 2, "adagrad"),    # encoder
    (wl("hf_t5.py"), 2, "rmsprop"),      # encoder-decoder
    (wl("hf_vit.py"), 2, "sgd"),         # vision transformer (a truncated-normal init)
    (wl("hf_convnext.py"), 2, "adam"),   # CNN (depthwise + pointwise convolutions: scratch probed)
    (wl("lstm.py"), 4, "sgd"),           # recurrent: nn.LSTM (oneDNN workspace)
    (wl("gru.py"), 4, "rmsprop"),        # recurrent: GRUCell loop
    ("examples:mlp", 100, "sgd"),
    ("examples:lenet", 4, "sgd"),       # peaks in conv1's backward, whose scratch is probed
]


@pytest.mark.parametrize("optimizer", ["default", "other"])
@pytest.mark.parametrize("spec,batch_size,other", ACCURACY, ids=[os.path.basename(a[0]) for a in ACCURACY])
def test_cpu_target_within_one_percent_of_the_profiler(spec, batch_size, other, optimizer):
    config = StepConfig(optimizer=None if optimizer == "default" else other)
    truth = measure_cpu_peak(spec, batch_size, config)
    trace = trace_step(spec, batch_size, config, target="cpu")
    peak = live_peak(trace).allocated_bytes
    assert trace.method == "fake-trace"
    assert abs(peak - truth) <= 0.01 * truth, f"trace {peak} vs profiler {truth}"


def test_resnet_example_conv_workspaces_make_sgd_exact():
    # ResNet + SGD peaks inside a convolution's backward, where oneDNN's blocked copies live
    config = StepConfig(optimizer="sgd")
    truth = measure_cpu_peak("examples:resnet", 1, config)
    peak = live_peak(trace_step("examples:resnet", 1, config)).allocated_bytes
    assert abs(peak - truth) <= 0.01 * truth


def test_categories_add_up_for_the_mlp():
    # nn.Linear(32, 16): weight 32*16*4 = 2048 B + bias 16*4 = 64 B -> 2112 B of parameters
    trace = trace_step("examples:mlp", 100, StepConfig(optimizer="adamw"))
    peak = live_peak(trace)
    assert peak.by_category["parameters"] == 2112
    # AdamW: exp_avg + exp_avg_sq per parameter (2 * 2112) + one fp32 `step` per parameter (2 * 4)
    assert peak.by_category["optimizer_state"] == 2 * 2112 + 2 * 4
    # inputs: x 100*32*4 = 12800 B + y 100 int64 = 800 B
    assert peak.by_category["inputs"] == 12800 + 800
    assert sum(peak.by_category.values()) == peak.allocated_bytes
    assert set(peak.by_category) == set(CATEGORIES)


def test_events_are_consistent_and_phases_known():
    trace = trace_step("examples:lenet", 4, StepConfig())
    assert 0 < trace.steady_start < len(trace.events)
    allocated = set()
    for ev in trace.events:
        assert ev.phase in PHASES and ev.category in CATEGORIES
        if ev.action == "alloc":
            assert ev.block not in allocated
            allocated.add(ev.block)
        else:
            assert ev.block in allocated
    steady = {ev.phase for ev in trace.events[trace.steady_start:]}
    assert {"forward", "backward", "optimizer", "zero_grad"} <= steady
    # gradients appear in backward and are freed by zero_grad(set_to_none=True)
    grad_frees = [ev for ev in trace.events[trace.steady_start:] if ev.category == "gradients" and ev.action == "free"]
    assert grad_frees and all(ev.phase == "zero_grad" for ev in grad_frees)
    modules = {ev.module for ev in trace.events[trace.steady_start:] if ev.phase == "forward"}
    assert "0" in modules  # the first Conv2d of the Sequential


def test_checkpointing_lowers_activations_as_it_really_does():
    config = StepConfig(optimizer="sgd", checkpointing=True)
    plain = live_peak(trace_step(wl("hf_gpt2.py"), 2, StepConfig(optimizer="sgd")))
    truth = measure_cpu_peak(wl("hf_gpt2.py"), 2, config)
    peak = live_peak(trace_step(wl("hf_gpt2.py"), 2, config))
    assert peak.by_category["activations"] < plain.by_category["activations"]
    assert abs(peak.allocated_bytes - truth) <= 0.01 * truth


@pytest.mark.parametrize("precision", ["fp16", "bf16", "bf16-pure"])
def test_precisions_match_the_profiler(precision):
    config = StepConfig(optimizer="adam", precision=precision)
    truth = measure_cpu_peak(wl("hf_gpt2.py"), 2, config)
    peak = live_peak(trace_step(wl("hf_gpt2.py"), 2, config)).allocated_bytes
    assert abs(peak - truth) <= 0.01 * truth


def test_bf16_pure_halves_parameters_and_scaler_has_state():
    fp32 = live_peak(trace_step("examples:mlp", 10, StepConfig(optimizer="sgd")))
    pure = live_peak(trace_step("examples:mlp", 10, StepConfig(optimizer="sgd", precision="bf16-pure")))
    assert pure.by_category["parameters"] * 2 == fp32.by_category["parameters"]
    fp16 = trace_step("examples:mlp", 10, StepConfig(optimizer="sgd", precision="fp16"))
    # GradScaler: scale (fp32, 4 B) + growth tracker (int32, 4 B) are its only state with SGD
    assert live_peak(fp16).by_category["optimizer_state"] == 8


@pytest.mark.parametrize("impl", ["for-loop", "foreach", "fused"])
def test_optimizer_implementations_trace(impl):
    config = StepConfig(optimizer="adamw", optimizer_impl=impl)
    truth = measure_cpu_peak("examples:mlp", 100, config)
    peak = live_peak(trace_step("examples:mlp", 100, config)).allocated_bytes
    assert abs(peak - truth) <= 0.01 * truth


def test_cuda_target_runs_attention_as_flash_with_a_logsumexp():
    # gpt-mini: 6 heads, 256 tokens. bf16 attention on a GPU is flash attention: it keeps a float32
    # logsumexp of batch*heads*tokens = 1*6*256*4 B = 6144 B per layer, not a 256x256 matrix per head.
    config = StepConfig(optimizer="sgd", precision="bf16")
    trace = trace_step("examples:gpt-mini", 1, config, target="cuda")
    assert trace.device_type == "cuda"
    flash = [ev for ev in trace.events[trace.steady_start:]
             if ev.action == "alloc" and ev.op == "aten._scaled_dot_product_flash_attention"]
    assert 6144 in {ev.nbytes for ev in flash}
    cpu = trace_step("examples:gpt-mini", 1, config, target="cpu")
    assert not any(ev.op == "aten._scaled_dot_product_flash_attention" for ev in cpu.events)


def test_cuda_target_recomputes_checkpointed_attention_with_the_same_kernel():
    # checkpointing recomputes the forward inside the autograd engine: the recomputed attention must be
    # flash again (else torch.utils.checkpoint raises: a different number of tensors saved)
    config = StepConfig(optimizer="sgd", precision="bf16", checkpointing=True)
    trace = trace_step("examples:gpt-mini", 1, config, target="cuda")
    backward_ops = {ev.op for ev in trace.events[trace.steady_start:] if ev.phase == "backward"}
    assert "aten._scaled_dot_product_flash_attention" in backward_ops  # the recomputation


def test_cuda_target_defaults_to_foreach_optimizers():
    # torch picks foreach for CUDA parameters: its temporaries are whole-list, the for-loop's per tensor
    cpu = trace_step("examples:mlp", 10, StepConfig(optimizer="adam"), target="cpu")
    cuda = trace_step("examples:mlp", 10, StepConfig(optimizer="adam"), target="cuda")
    ops = {ev.op for ev in cuda.events[cuda.steady_start:] if ev.phase == "optimizer"}
    assert any(op.startswith("aten._foreach") for op in ops)
    assert not any(ev.op.startswith("aten._foreach") for ev in cpu.events)


def test_flops_match_flop_counter_on_a_real_step():
    from torch.utils.flop_counter import FlopCounterMode

    from gpuwise.step import TrainStep

    workload = load_workload("examples:lenet")
    step = TrainStep(workload, StepConfig(optimizer="sgd"), "cpu")
    batch = workload.build_batch(4)
    with FlopCounterMode(display=False) as counter:
        step.step(batch)
    trace = trace_step("examples:lenet", 4, StepConfig(optimizer="sgd"))
    assert trace.flops_per_step == counter.get_total_flops() > 0


def test_data_dependent_forward_falls_back_and_says_so():
    config = StepConfig(optimizer="sgd")
    trace = trace_step(wl("datadep.py"), 8, config)
    assert trace.method == "real-trace"
    assert "DataDependentOutputException" in trace.notes[0]
    truth = measure_cpu_peak(wl("datadep.py"), 8, config)
    # the backward of h[keep] (index_put into fresh zeros) is counted in place, as it runs without a mode
    assert abs(live_peak(trace).allocated_bytes - truth) <= 0.01 * truth


def test_model_whose_init_reads_data_is_still_fake_traced(init_reads_data):
    trace = trace_step(wl("hf_vit.py"), 1, StepConfig(optimizer="sgd"))
    assert trace.method == "fake-trace"
    assert any("real weights" in n for n in trace.notes)


def test_a_truncated_normal_init_builds_under_fake_tensors_as_built_for_real(monkeypatch, init_reads_data):
    """torch 2.13's `trunc_normal_` samples by rejection, reading the data (`mask.any()`), so every model that
    calls it (ViT, SigLIP and what embeds it: Gemma 3) was built with real weights, and refused as "cannot tell"
    where that would not fit in host memory. gpuwise builds it under fake tensors with the inverse-CDF sampler
    torch up to 2.12 used: no data read, no real weights. The step is the same as built for real (the
    `init_reads_data` fixture forces that path): every event from the first forward on, the same peak, and the
    same setup allocations in another order (built in construction order, not copied in parameter order)."""
    from gpuwise.plan.tracing import setup
    from gpuwise.plan.tracing.repeat import canonical

    config = StepConfig(optimizer="adamw", precision="bf16")
    copied = trace_step(wl("hf_vit.py"), 2, config, target="cuda")
    monkeypatch.setattr(setup, "_trunc_normal_in_place", init_reads_data)
    built = trace_step(wl("hf_vit.py"), 2, config, target="cuda")
    assert any("real weights" in n for n in copied.notes)
    assert built.method == "fake-trace" and not any("real weights" in n for n in built.notes)
    assert live_peak(built) == live_peak(copied)
    (steady, rows), (steady_copied, rows_copied) = canonical(built), canonical(copied)
    first = next(i for i, row in enumerate(rows) if row[4] != "setup")
    assert steady == steady_copied and rows[first:] == rows_copied[first:]
    assert sorted(r[2:5] for r in rows[:first]) == sorted(r[2:5] for r in rows_copied[:first])


def test_a_model_whose_init_reads_data_is_not_built_for_real_when_it_would_not_fit(monkeypatch, init_reads_data):
    """Building it with real weights takes its parameters' bytes of host memory: refused, one line, before
    any allocation (Byte Latent Transformer's default config asked for 17 GiB and the machine killed gpuwise)."""
    from gpuwise.plan.tracing import fallback

    monkeypatch.setattr(fallback, "_available_bytes", lambda: 1024)
    with pytest.raises(GpuwiseError, match="cannot tell: the model's initialisation reads data .* building it "
                                           "with real weights would need"):
        trace_step(wl("hf_vit.py"), 1, StepConfig(optimizer="sgd"))


def test_extrapolation_from_batch_one_and_two():
    from gpuwise.plan.tracing.fallback import extrapolate
    from gpuwise.plan.tracing.trace import run_real

    workload = load_workload("examples:mlp")
    one, two = (run_real(workload, b, StepConfig(optimizer="sgd"), "cpu") for b in (1, 2))
    guess = extrapolate(one, two, 50)
    assert guess is not None and guess.method == "real-trace-extrapolated"
    exact = live_peak(trace_step("examples:mlp", 50, StepConfig(optimizer="sgd"))).allocated_bytes
    assert live_peak(guess).allocated_bytes == exact


def test_probe_measures_conv_scratch_on_this_cpu():
    from gpuwise.plan.tracing.probe import probe

    # the same 64->64 3x3 layer as below, run for real once: the blocked copies (in + w + out) are the
    # most it holds, and its output is 2*64*32*32*4 = 524288 B
    x, w = torch.zeros(2, 64, 32, 32), torch.zeros(64, 64, 3, 3)
    measured = probe(torch.ops.aten.convolution.default, "aten.convolution",
                     (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), {})
    assert measured is not None and measured.output_bytes == {0: 524288}
    assert measured.workspace.before_bytes >= 524288 + 147456 + 524288


def test_oneDNN_rnn_workspace_matches_a_measured_size():
    # measured: torch.ops.aten.mkldnn_rnn_layer on (T=12, N=4, I=32, H=32) returns a 114688-byte workspace
    x = torch.empty(12, 4, 32)
    args = (x, None, None, None, None, None, None, False, [], 2, 32, 1, True, False, False, True)
    assert kernels.output_bytes("aten.mkldnn_rnn_layer", "cpu", args, {}) == {3: 114688}
    assert kernels.output_bytes("aten.mkldnn_rnn_layer", "cuda", args, {}) == {}


def test_conv_forward_workspace_is_the_blocked_copies():
    # 64->64 3x3 conv, batch 2, 32x32: input, weight and output in blocked layouts, 64 channels are
    # whole blocks so no padding: in 2*64*32*32*4 = 524288, w 64*64*9*4 = 147456, out 524288
    x, w = torch.empty(2, 64, 32, 32), torch.empty(64, 64, 3, 3)
    ws = kernels.workspace("aten.convolution", "cpu", (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), {})
    assert ws.before_bytes == 524288 + 147456 + 524288
    assert ws.during_bytes == 524288
    assert kernels.workspace("aten.convolution", "cuda", (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
                             {}) == kernels.NONE


def test_bad_input_is_one_clear_error():
    with pytest.raises(GpuwiseError, match="target"):
        trace_step("examples:mlp", 4, target="tpu")
    with pytest.raises(GpuwiseError, match="batch size"):
        trace_step("examples:mlp", 0)
    with pytest.raises(GpuwiseError, match="warm-up"):
        trace_step("examples:mlp", 4, warmup="none")


def test_a_model_that_raises_in_forward_is_not_hidden_by_the_fallback(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text(
        "import torch\n"
        "def model():\n    return torch.nn.Linear(2, 2)\n"
        "def batch(n):\n    return torch.zeros(n, 2)\n"
        "def loss(model, batch):\n    raise ValueError('bad forward')\n"
    )
    with pytest.raises(ValueError, match="bad forward"):
        trace_step(str(path), 2)


def test_module_names_do_not_outlive_a_recompute_that_checkpoint_stops_early():
    """Non-reentrant checkpoint stops its recompute with an exception once the saved tensors are back:
    the blocks it entered must still leave the scope's stack (else later events get their names)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    from gpuwise.plan.tracing.scope import ModuleScope

    block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4), torch.nn.Tanh())
    with ModuleScope() as scope:
        checkpoint(block, torch.randn(2, 4, requires_grad=True), use_reentrant=False).sum().backward()
        assert scope.stack == [] and scope.current() == ""


def test_a_real_fallback_that_fails_otherwise_is_cannot_tell_with_both_errors(tmp_path):
    """Fake tensors cannot run a data-dependent op; the real-tensor fallback then raises an error of its own
    (on the CUDA target, e.g., a GPU-only attention kernel): "cannot tell", one line naming both, not the
    second error alone as if it were the workload's."""
    path = tmp_path / "dynamic.py"
    path.write_text(
        "import torch\n"
        "from torch._guards import detect_fake_mode\n"
        "def model():\n    return torch.nn.Linear(4, 4)\n"
        "def batch(n):\n    return torch.randn(n, 4)\n"
        "def loss(model, batch):\n"
        "    out = model(batch)\n"
        "    kept = out[torch.nonzero(out > 0, as_tuple=True)]  # its size depends on the data\n"
        "    if detect_fake_mode() is None:\n"
        "        raise RuntimeError('a kernel real tensors lack')\n"
        "    return kept.sum()\n"
    )
    with pytest.raises(GpuwiseError) as exc:
        trace_step(str(path), 2)
    msg = str(exc.value)
    assert msg.startswith("cannot tell: fake tensors could not run the step") and "\n" not in msg
    assert "on real CPU tensors it raised RuntimeError: a kernel real tensors lack" in msg
