"""The settings people run, as flags (issue 21 "Express what people run"): LoRA targets / alpha / dropout,
the base weights' dtype, QLoRA's 4-bit formats, selective checkpointing. Each traced on a tiny Llama and
held against the CPU profiler's truth of the same step (as tests/test_plan_modes.py does)."""

import pytest
import torch

from gpuwise.errors import GpuwiseError
from gpuwise.plan.memory.events import live_peak
from gpuwise.plan.tracing.cpu_truth import measure_cpu_peak
from gpuwise.plan.tracing.modes import apply_modes, make_modes
from gpuwise.plan.tracing.trace import trace_step
from gpuwise.step import StepConfig
from gpuwise.workload import load_workload

LLAMA = "tests/workloads/hf_llama.py"
TOLERANCE = 0.005  # 0.5 % of the profiler's peak, as test_plan_modes.py


@pytest.mark.parametrize("name,modes_kw,precision,checkpointing", [
    ("lora-qv-alpha-dropout", {"lora": 8, "lora_targets": "q_proj,v_proj", "lora_alpha": 16, "lora_dropout": 0.05},
     "bf16", False),
    ("bf16-mixed-lora", {"lora": 8, "base_dtype": "fp32"}, "bf16", False),
    ("bf16-true-lora", {"lora": 8}, "bf16-pure", False),
    ("selective-ac", {}, "fp32", "selective"),
])
def test_expressed_mode_matches_cpu_profiler(name, modes_kw, precision, checkpointing):
    wl = apply_modes(load_workload(LLAMA), make_modes(**modes_kw), precision)
    cfg = StepConfig(optimizer="adamw", precision=precision, checkpointing=checkpointing)
    trace = trace_step(wl, 2, cfg, target="cpu")
    assert trace.method == "fake-trace", trace.notes  # no fallback to real tensors
    peak, truth = live_peak(trace).allocated_bytes, measure_cpu_peak(wl, 2, cfg)
    assert abs(peak - truth) <= TOLERANCE * truth, (name, peak, truth)


def test_lora_targets_alpha_and_dropout_reach_peft():
    model = apply_modes(load_workload(LLAMA), make_modes(lora=4, lora_targets=["q_proj", "v_proj"], lora_alpha=8,
                                                         lora_dropout=0.1)).build_model()
    adapted = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in model.named_parameters() if ".lora_A" in n}
    assert adapted == {"q_proj", "v_proj"}
    layer = next(m for n, m in model.named_modules() if n.endswith("q_proj") and hasattr(m, "scaling"))
    assert layer.scaling["default"] == 8 / 4                          # alpha / r
    assert layer.lora_dropout["default"].p == 0.1


def test_base_dtype_and_bf16_true_adapters():
    wl = load_workload(LLAMA)
    mixed = apply_modes(wl, make_modes(lora=4, base_dtype="fp32"), "bf16").build_model()
    assert {p.dtype for p in mixed.parameters()} == {torch.float32}  # bf16-mixed: fp32 weights, autocast
    peft_usual = apply_modes(wl, make_modes(lora=4), "bf16").build_model()
    assert {p.dtype for p in peft_usual.parameters() if not p.requires_grad} == {torch.bfloat16}
    assert {p.dtype for p in peft_usual.parameters() if p.requires_grad} == {torch.float32}
    true = apply_modes(wl, make_modes(lora=4), "bf16-pure").build_model()
    assert {p.dtype for p in true.parameters()} == {torch.bfloat16}  # litgpt bf16-true: adapters too


def test_qlora_formats_store_what_bitsandbytes_stores():
    pytest.importorskip("bitsandbytes")
    from gpuwise.plan.tracing.quant4bit import nf4_bytes

    wl = load_workload(LLAMA)

    def stored(quant):
        m = apply_modes(wl, make_modes(qlora=True, qlora_quant=quant), "bf16").build_model()
        sizes = [mod.in_features * mod.out_features for mod in m.modules() if type(mod).__name__ == "Linear4bit"]
        return sum(t.numel() * t.element_size() for t in [*m.parameters(), *m.buffers()]), sizes

    dq, sizes = stored("nf4-dq")
    plain, _ = stored("nf4")
    assert sizes and stored("fp4")[0] == plain  # fp4 and nf4 pack the same 4 bits and fp32 absmax
    # without double quantization: an fp32 absmax per 64-weight block instead of a uint8 one, and no
    # second-level absmax / code book / offset (nf4_bytes, from bitsandbytes' quantize_4bit)
    assert plain - dq == sum(nf4_bytes(n, double_quant=False) - nf4_bytes(n) for n in sizes)


def test_qlora_in_bf16_true_traces_with_fake_tensors():
    # the bf16-pure move used to drop bitsandbytes' quant_state from the 4-bit weights, so every QLoRA
    # trace in bf16-true fell back to real tensors (refused above 2B parameters)
    wl = apply_modes(load_workload(LLAMA), make_modes(qlora=True, lora=8), "bf16-pure")
    trace = trace_step(wl, 2, StepConfig(precision="bf16-pure"), target="cuda")
    assert trace.method == "fake-trace", trace.notes


@pytest.mark.parametrize("kw,match", [
    ({"qlora_quant": "nf4"}, "applies to --qlora"),
    ({"lora_targets": "q_proj"}, "apply to --lora"),
    ({"lora": 4, "lora_dropout": 1.5}, "lora-dropout"),
    ({"lora": 4, "base_dtype": "int8"}, "base-dtype"),
    ({"qlora": True, "base_dtype": "fp32"}, "4 bits"),
])
def test_bad_combinations_are_one_line_errors(kw, match):
    with pytest.raises(GpuwiseError, match=match):
        make_modes(**kw)


def test_unknown_lora_target_is_a_one_line_error():
    with pytest.raises(GpuwiseError, match="--lora-targets"):
        apply_modes(load_workload(LLAMA), make_modes(lora=4, lora_targets="query_key_value")).build_model()


def test_selective_checkpointing_keeps_less_than_none_more_than_full():
    wl = load_workload(LLAMA)
    peaks = {c: live_peak(trace_step(wl, 4, StepConfig(checkpointing=c), target="cpu")).by_category["activations"]
             for c in (False, "selective", True)}
    assert peaks[True] < peaks["selective"] < peaks[False], peaks


def test_checkpointing_words():
    assert StepConfig(checkpointing="full").checkpointing is True
    assert StepConfig(checkpointing="none").checkpointing is False
    assert StepConfig(checkpointing="selective").checkpointing == "selective"
    with pytest.raises(GpuwiseError):
        StepConfig(checkpointing="some")


def test_qlora_quantizes_linear_subclasses():
    # Falcon's layers are FalconLinear (an nn.Linear subclass); transformers quantizes them (isinstance)
    pytest.importorskip("bitsandbytes")
    from transformers import FalconConfig, FalconForCausalLM

    from gpuwise.plan.tracing.quant4bit import quantize_linear_4bit

    model = FalconForCausalLM(FalconConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, vocab_size=128,
                                           new_decoder_architecture=False, multi_query=True)).to(torch.bfloat16)
    assert quantize_linear_4bit(model) == 2 * 4          # per layer: query_key_value, dense, h_to_4h, 4h_to_h
    assert type(model.lm_head).__name__ == "Linear"      # the output head stays 16-bit


def test_bitsandbytes_before_0_43_2_keeps_each_4bit_layer_input():
    # bitsandbytes PR #1270 (0.43.2) stopped MatMul4Bit from keeping its input A: an older release's run
    # holds every quantized layer's input until its backward; the installed release (or a newer one) does not
    pytest.importorskip("bitsandbytes")
    from gpuwise.plan.tracing.bnb_versions import keeps_matmul_input

    assert keeps_matmul_input("0.41.1") and keeps_matmul_input("0.43.1") and not keeps_matmul_input("0.43.2")

    def activations(version):
        wl = apply_modes(load_workload(LLAMA), make_modes(qlora=True, lora=8, bnb_version=version), "bf16")
        return live_peak(trace_step(wl, 2, StepConfig(precision="bf16"), target="cpu")).by_category["activations"]

    now = activations(None)
    assert activations("0.45.0") == now
    assert activations("0.41.1") > now
    with pytest.raises(GpuwiseError, match="applies to --qlora"):
        make_modes(lora=8, bnb_version="0.41.1")
    with pytest.raises(GpuwiseError, match="bnb-version"):
        make_modes(qlora=True, bnb_version="latest")


def test_bitsandbytes_before_0_50_dequantizes_each_weight_in_the_forward():
    # up to 0.49.x MatMul4Bit.forward ran F.linear(A, F.dequantize_4bit(B, quant_state).to(A.dtype).t(), bias):
    # the layer's 16-bit weight alive through the matmul; 0.50.0 (PR #1949) calls the fused gemm_4bit
    pytest.importorskip("bitsandbytes")
    from gpuwise.plan.tracing.bnb_versions import dequantizes_in_forward

    assert dequantizes_in_forward("0.42.0") and dequantizes_in_forward("0.49.2")
    assert not dequantizes_in_forward("0.50.0") and not dequantizes_in_forward(None)
    from gpuwise.plan.tracing.bnb_versions import quantizes_from_fp16

    assert quantizes_from_fp16("0.42.0") and not quantizes_from_fp16("0.43.0")  # Params4bit.cuda's .half()

    def forward_dequantized(version):
        wl = apply_modes(load_workload(LLAMA), make_modes(qlora=True, lora=8, bnb_version=version), "bf16")
        trace = trace_step(wl, 2, StepConfig(precision="bf16"), target="cpu")
        return [e.nbytes for e in trace.events[trace.steady_start:]
                if e.action == "alloc" and e.phase == "forward" and "dequantize_4bit" in e.op]

    assert forward_dequantized(None) == []
    old = forward_dequantized("0.49.2")
    assert old and all(n > 0 for n in old)


def test_lightning_quantizes_the_head_too_from_fp16():
    # Fabric's BitsandbytesPrecision (litgpt --quantize bnb.*): every nn.Linear, the head included, cast to
    # float16 before quantize_4bit; transformers keeps the head in 16 bits
    pytest.importorskip("bitsandbytes")
    from transformers import LlamaConfig, LlamaForCausalLM

    from gpuwise.plan.tracing.quant4bit import quantize_linear_4bit

    def model():
        return LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                            num_hidden_layers=1, vocab_size=128)).to(torch.bfloat16)

    hf, lightning = model(), model()
    assert quantize_linear_4bit(lightning, keep_head=False, from_dtype=torch.float16) == quantize_linear_4bit(hf) + 1
    assert type(hf.lm_head).__name__ == "Linear" and type(lightning.lm_head).__name__ == "Linear4bit"
    assert lightning.lm_head.weight.quant_state.dtype == torch.float16
    assert hf.model.layers[0].mlp.up_proj.weight.quant_state.dtype == torch.bfloat16
    with pytest.raises(GpuwiseError, match="applies to --qlora"):
        make_modes(lora=8, qlora_by="lightning")
    with pytest.raises(GpuwiseError, match="qlora-by"):
        make_modes(qlora=True, qlora_by="torchao")


def test_bf16_true_leaves_the_4bit_quant_state_in_bitsandbytes_dtypes():
    # model.to(bf16) (litgpt's bf16-true) casts parameters and buffers, not bitsandbytes' quant state (an
    # attribute of the 4-bit weight): the fp32 absmax of NF4 without double quantization stays fp32
    def buffers(precision):
        wl = apply_modes(load_workload(LLAMA), make_modes(qlora=True, lora=8, qlora_quant="nf4"), precision)
        trace = trace_step(wl, 2, StepConfig(precision=precision), target="cuda")
        return live_peak(trace).by_category["buffers"]

    assert buffers("bf16-pure") == buffers("bf16")
