"""Training modes people use, applied to a workload so that the trace runs the real libraries.

- gradient accumulation (`grad_accum=N`): N micro-steps of forward + backward into the same gradients,
  then one optimizer step. From the second micro-step on, every gradient is alive during forward and
  backward, so micro-steps 2..N have the same peak: the trace runs `min(N, 2)` of them.
- frozen parts (`freeze=[regex, ...]`): matching parameters get `requires_grad=False`: no gradient, no
  optimizer state.
- LoRA (`lora_rank=r`): `peft.get_peft_model(model, LoraConfig(r, lora_alpha, lora_dropout,
  target_modules))`: targets "all-linear" unless named (`lora_targets=("q_proj", "v_proj")`, litgpt's and
  torchtune's defaults), alpha 2r unless given, dropout 0 unless given (a dropout > 0 keeps its mask and
  its output for the adapter's backward). The frozen base is stored in `base_dtype` when given, else in the
  training's 16-bit dtype (as people load it with `torch_dtype=torch.bfloat16`) unless the precision is
  fp32: `base_dtype="fp32"` with bf16 precision is Lightning's bf16-mixed (fp32 weights + autocast). peft
  keeps the adapters in fp32 (`autocast_adapter_dtype=True`), except under `bf16-pure` (litgpt's
  bf16-true: every parameter in bf16).
- QLoRA (`qlora=True`): every `nn.Linear` of the base but the output head becomes bitsandbytes'
  `Linear4bit` (`qlora_quant`: "nf4-dq" NF4 with double quantization, the default and the QLoRA paper's
  recipe; "nf4" without; "fp4"; bf16 compute), quantized by bitsandbytes itself
  (`Params4bit._quantize` -> `quantize_4bit`): 0.5 byte per weight plus one absmax per 64 weights, kept
  as uint8 with one fp32 absmax per 256 of those and an offset (bitsandbytes/functional.py `quantize_4bit`,
  `compress_statistics=True`; QLoRA paper, Dettmers et al. 2023, sec. 3 "Double Quantization"). Then LoRA
  as above (peft wraps bitsandbytes layers with `peft.tuners.lora.bnb.Linear4bit`). bitsandbytes' ops
  have fake kernels (bitsandbytes/_ops.py), so this runs under fake tensors. Not seen with the installed
  release: the transient dequantized weight of the CUDA forward (`gemm_4bit` hides it; one layer's 16-bit
  weight at a time); releases before 0.50 dequantized it in plain torch, which `bnb_version` puts back
  (plan/tracing/bnb_versions.py). The backward's `dequantize_4bit` is seen. `qlora_by="lightning"`:
  Fabric's BitsandbytesPrecision as litgpt runs it, the head quantized too, from fp16 (QLORA_BY).
- CPU offload of the optimizer state (`offload_optimizer=True`): a transform of the traced step (the
  state's blocks and the optimizer's temporaries leave the device; gradients stay until copied), as
  DeepSpeed ZeRO-Offload / FSDP2 `CPUOffloadPolicy` keep the optimizer step on the host.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ... import optional_libs
from ...errors import GpuwiseError
from ...hf import module_matches
from ...step import hold_loss
from ...workload import Workload
from ..memory.events import MemEvent, MemoryTrace
from .bnb_versions import bitsandbytes_as, parse_version, quantizes_from_fp16
from .losses import (
    CROSS_ENTROPY,
    CROSS_ENTROPY_NAMES,
    causal_lm_loss,
    check_cross_entropy,
    check_train_metrics,
)
from .quant4bit import QLORA_QUANTS, quantize_linear_4bit

LORA_ALPHA_PER_RANK = 2


@dataclass(frozen=True)
class TrainingModes:
    grad_accum: int = 1
    lora_rank: int | None = None
    qlora: bool = False
    freeze: tuple[str, ...] = field(default_factory=tuple)
    offload_optimizer: bool = False
    lora_targets: tuple[str, ...] | None = None   # None: "all-linear"
    lora_alpha: float | None = None               # None: LORA_ALPHA_PER_RANK x rank
    lora_dropout: float = 0.0
    base_dtype: str | None = None                 # fp32 / bf16 / fp16; None: from the precision
    qlora_quant: str = "nf4-dq"
    bnb_version: str | None = None                # the bitsandbytes release emulated (None: installed)
    qlora_by: str = "transformers"                # who quantizes the base: QLORA_BY
    cross_entropy: str = "model"                  # a causal LM's loss: losses.CROSS_ENTROPY
    train_metrics: int = 0                        # cross-entropy metrics over the logits after each backward

    def __post_init__(self):
        if isinstance(self.grad_accum, bool) or not isinstance(self.grad_accum, int) or self.grad_accum < 1:
            raise GpuwiseError(f"--grad-accum must be a positive integer, got {self.grad_accum!r}")
        if self.lora_rank is not None and (not isinstance(self.lora_rank, int) or self.lora_rank < 1):
            raise GpuwiseError(f"--lora rank must be a positive integer, got {self.lora_rank!r}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise GpuwiseError(f"--lora-dropout must be in [0, 1), got {self.lora_dropout!r}")
        if self.base_dtype is not None and self.base_dtype not in BASE_DTYPES:
            raise GpuwiseError(f"--base-dtype must be one of {', '.join(BASE_DTYPES)}, got {self.base_dtype!r}")
        if self.qlora_quant not in QLORA_QUANTS:
            raise GpuwiseError(f"--qlora-quant must be one of {', '.join(QLORA_QUANTS)}, got {self.qlora_quant!r}")
        if self.qlora_by not in QLORA_BY:
            raise GpuwiseError(f"--qlora-by must be one of {', '.join(QLORA_BY)}, got {self.qlora_by!r}")
        if self.cross_entropy not in CROSS_ENTROPY:
            raise GpuwiseError(f"--cross-entropy must be one of {', '.join(CROSS_ENTROPY)}, got {self.cross_entropy!r}")
        if isinstance(self.train_metrics, bool) or not isinstance(self.train_metrics, int) or self.train_metrics < 0:
            raise GpuwiseError(f"--train-metrics must be a whole number >= 0, got {self.train_metrics!r}")
        if self.qlora_by != "transformers" and not self.qlora:
            raise GpuwiseError("--qlora-by applies to --qlora")
        if self.bnb_version is not None:
            parse_version(self.bnb_version)
            if not self.qlora:
                raise GpuwiseError("--bnb-version applies to --qlora")
        if self.qlora and self.base_dtype == "fp32":
            raise GpuwiseError("--qlora stores the base in 4 bits: --base-dtype sets only a 16-bit compute dtype")
        if not self.adapters and (self.lora_targets or self.lora_alpha is not None or self.lora_dropout
                                  or self.base_dtype is not None):
            raise GpuwiseError("--lora-targets / --lora-alpha / --lora-dropout / --base-dtype apply to --lora or "
                               "--qlora (for full training in bf16 weights use --precision bf16-pure)")
        for pattern in self.freeze:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise GpuwiseError(f"--freeze {pattern!r}: not a regular expression ({exc})") from None

    @property
    def traced_micro_steps(self) -> int:
        return min(self.grad_accum, 2)

    @property
    def adapters(self) -> bool:
        return self.lora_rank is not None or self.qlora

    @property
    def is_default(self) -> bool:
        return self == TrainingModes()

    def describe(self) -> list[str]:
        out = []
        if self.grad_accum > 1:
            out.append(f"gradient accumulation x{self.grad_accum}")
        detail = "".join([f", {'+'.join(self.lora_targets)}" if self.lora_targets else "",
                          f", alpha {self.lora_alpha:g}" if self.lora_alpha is not None else "",
                          f", dropout {self.lora_dropout:g}" if self.lora_dropout else "",
                          f", base {self.base_dtype}" if self.base_dtype else ""])
        if self.qlora:
            bnb = f", bitsandbytes {self.bnb_version}" if self.bnb_version else ""
            bnb += ", quantized as Lightning does (head too, from fp16)" if self.qlora_by == "lightning" else ""
            out.append(f"QLoRA ({self.qlora_quant.upper()} base, LoRA r={self.lora_rank or DEFAULT_LORA_RANK}"
                       f"{detail}{bnb})")
        elif self.lora_rank:
            out.append(f"LoRA r={self.lora_rank}{detail}")
        if self.freeze:
            out.append("frozen: " + ", ".join(self.freeze))
        if self.offload_optimizer:
            out.append("optimizer state offloaded to the CPU")
        if self.cross_entropy != "model":
            out.append(CROSS_ENTROPY_NAMES[self.cross_entropy])
        if self.train_metrics:
            out.append(f"{self.train_metrics} training metric{'s' if self.train_metrics > 1 else ''} over the "
                       "logits after each backward (Composer's)")
        return out


DEFAULT_LORA_RANK = 16
BASE_DTYPES = ("fp32", "bf16", "fp16")
# Who replaces the base's linear layers by 4-bit ones. transformers (BitsAndBytesConfig + from_pretrained;
# peft's QLoRA): every nn.Linear but the output head (`get_keys_to_not_convert`), quantized from the
# 16-bit weight it loads. lightning (Fabric's BitsandbytesPrecision, which litgpt's `--quantize bnb.*` uses
# without `ignore_modules`): every nn.Linear, the output head included (`_convert_layers`), each weight cast
# to float16 before `quantize_4bit` (lightning/fabric/plugins/precision/bitsandbytes.py `quantize`:
# `weight.contiguous().to(device=device, dtype=torch.half)`), so its quant_state.dtype is float16 and a
# bitsandbytes < 0.50 forward dequantizes to fp16, then casts to the bf16 compute dtype.
QLORA_BY = ("transformers", "lightning")


def make_modes(grad_accum: int = 1, lora: int | bool | None = None, qlora: bool = False,
               freeze: Sequence[str] | str | None = None, offload_optimizer: bool = False, *,
               lora_targets: Sequence[str] | str | None = None, lora_alpha: float | None = None,
               lora_dropout: float | None = None, base_dtype: str | None = None,
               qlora_quant: str | None = None, bnb_version: str | None = None,
               qlora_by: str | None = None, cross_entropy: str | None = None,
               train_metrics: int | None = None) -> TrainingModes:
    if qlora_quant is not None and not qlora:
        raise GpuwiseError("--qlora-quant applies to --qlora")
    if isinstance(lora_targets, str):
        lora_targets = [t.strip() for t in lora_targets.split(",") if t.strip()]
    if lora is True:
        lora = DEFAULT_LORA_RANK
    if lora is False:
        lora = None
    if isinstance(freeze, str):
        freeze = [freeze]
    return TrainingModes(grad_accum, lora, bool(qlora), tuple(freeze or ()), bool(offload_optimizer),
                         tuple(lora_targets) if lora_targets else None,
                         None if lora_alpha is None else float(lora_alpha), float(lora_dropout or 0.0),
                         base_dtype, qlora_quant or "nf4-dq", bnb_version, qlora_by or "transformers",
                         cross_entropy or "model", train_metrics or 0)


def apply_modes(wl: Workload, modes: TrainingModes, precision: str = "fp32") -> Workload:
    """A workload whose model / loss carry the modes (the same object when there are none to apply)."""
    own_loss = modes.cross_entropy == "model" and not modes.train_metrics
    if modes.grad_accum == 1 and not modes.adapters and not modes.freeze and own_loss:
        return wl
    base_build, base_loss = wl.build_model, wl.compute_loss
    if not own_loss:
        check_cross_entropy(modes.cross_entropy, wl)
        check_train_metrics(modes.train_metrics, modes.cross_entropy, wl)
        base_loss = causal_lm_loss(modes.cross_entropy, wl.spec, wl.hf_config,  # type: ignore[attr-defined]
                                   modes.train_metrics)

    def model():
        # With adapters the base arrives in its storage dtype (4-bit / 16-bit), as from_pretrained with
        # torch_dtype / a BitsAndBytesConfig delivers it: the fp32 build and the casts are not device traffic.
        tracer = _tracer() if modes.adapters else None
        with tracer.paused() if tracer is not None else contextlib.nullcontext():
            m = base_build()
            if modes.freeze:
                _freeze(m, modes.freeze)
            if modes.adapters:
                with fake_params_set_in_place():
                    m = _with_adapters(m, modes, precision)
        return m

    def loss(model, batch):
        with bitsandbytes_as(modes.bnb_version if modes.qlora else None):  # what the forward keeps
            for _ in range(modes.traced_micro_steps - 1):
                _mark_trace_phase("forward")
                micro = base_loss(model, batch)
                hold_loss(micro)  # a loop that keeps its last loss releases the one before only now
                micro.backward()  # gradients accumulate into .grad
                del micro
            _mark_trace_phase("forward")
            return base_loss(model, batch)

    out = Workload(spec=wl.spec, model_fn=model, batch_fn=wl.batch_fn, loss_fn=loss,
                   optimizer_fn=wl.optimizer_fn, dataset_fn=wl.dataset_fn, collate_fn=wl.collate_fn,
                   source=wl.source)
    for attr in ("hf_config", "seq_len", "task", "target_len"):
        if hasattr(wl, attr):
            setattr(out, attr, getattr(wl, attr))
    out.build_model = lambda: _checked_model(out, model)  # type: ignore[method-assign]
    return out


def _checked_model(wl: Workload, fn):
    import torch

    m = fn()
    if not isinstance(m, torch.nn.Module):
        raise GpuwiseError(f"{wl.spec}: model() must return a torch.nn.Module, got {type(m).__name__}")
    if not any(p.requires_grad for p in m.parameters()):
        raise GpuwiseError(f"{wl.spec}: every parameter is frozen: nothing to train")
    return m


@contextlib.contextmanager
def fake_params_set_in_place():
    """`Module.to()` swaps fake parameters (`torch.utils.swap_tensors`), which fails while FakeTensorMode
    holds a weakref to them; peft and the dtype cast call it on fake models. Inside, a swap that fails on
    fake tensors sets `param.data` instead, the path real parameters take: same objects, ties kept."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    original = torch.utils.swap_tensors

    def swap(t1, t2):
        try:
            return original(t1, t2)
        except RuntimeError:
            if not isinstance(t1, FakeTensor):
                raise
            t1.data = t2.data

    torch.utils.swap_tensors = swap
    try:
        yield
    finally:
        torch.utils.swap_tensors = original


def _freeze(model, patterns: tuple[str, ...]) -> int:
    compiled = [re.compile(p) for p in patterns]
    n = 0
    for name, p in model.named_parameters():
        if any(c.search(name) for c in compiled):
            p.requires_grad_(False)
            n += 1
    if n == 0:
        raise GpuwiseError(f"--freeze {', '.join(patterns)}: no parameter name matches")
    return n


def _tracer():
    """gpuwise's tracing dispatch mode when one is active (plan/tracing/dispatch.py `TraceMode`), else None."""
    from .dispatch import active_trace_mode

    return active_trace_mode()


def _mark_trace_phase(phase: str) -> None:
    """Tell gpuwise's tracer (when one runs) that a micro-step's forward starts, so that its activations
    are categorised as in the first micro-step. A no-op in a real run."""
    mode = _tracer()
    if mode is not None and mode.phase != "setup":
        mode.phase = phase


def _with_adapters(model, modes: TrainingModes, precision: str):
    import torch

    stand_in = not optional_libs.available("peft")
    if stand_in and (modes.qlora or modes.lora_targets or modes.lora_dropout or _peft_task(model) == "SEQ_CLS"
                     or any(type(m).__name__ == "Conv1D" for m in model.modules())):
        raise GpuwiseError("QLoRA, and LoRA with named targets, dropout, a classifier head or GPT-2's Conv1D "
                           "layers, need peft (pip install peft)")
    if stand_in and not all_fake_model(model):
        raise GpuwiseError("LoRA needs peft (pip install peft)")
    dtypes = {"bf16": torch.bfloat16, "bf16-pure": torch.bfloat16, "fp16": torch.float16, "fp32": None}
    base_dtype = dtypes.get(modes.base_dtype or precision)
    if modes.qlora:
        base_dtype = base_dtype or torch.bfloat16
    if base_dtype is not None:
        model = model.to(base_dtype)
        _keep_in_fp32(model, base_dtype)
    for p in model.parameters():
        p.requires_grad_(False)
    if modes.qlora:
        quant_type, double_quant = QLORA_QUANTS[modes.qlora_quant]
        lightning = modes.qlora_by == "lightning"
        from_fp16 = lightning or quantizes_from_fp16(modes.bnb_version)
        quantize_linear_4bit(model, compute_dtype=base_dtype, quant_type=quant_type, double_quant=double_quant,
                             keep_head=not lightning, from_dtype=torch.float16 if from_fp16 else None)
    rank = modes.lora_rank or DEFAULT_LORA_RANK
    alpha = modes.lora_alpha if modes.lora_alpha is not None else LORA_ALPHA_PER_RANK * rank
    if stand_in:  # a trace: the same adapters and forward (optional_libs.py)
        return optional_libs.lora_layout(model, rank, alpha, torch.bfloat16 if precision == "bf16-pure" else torch.float32)
    peft = optional_libs.imported("peft")
    LoraConfig, get_peft_model = peft.LoraConfig, peft.get_peft_model
    targets = list(modes.lora_targets) if modes.lora_targets else "all-linear"
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=modes.lora_dropout,
                        target_modules=targets, task_type=_peft_task(model))
    try:
        # bf16-pure (litgpt's bf16-true): the adapters are bf16 too; else peft's fp32 adapters
        peft_model = get_peft_model(model, config, autocast_adapter_dtype=precision != "bf16-pure")
    except ValueError as exc:  # peft: "Target modules {...} not found in the base model"
        raise GpuwiseError(f"--lora-targets {','.join(modes.lora_targets or ())}: {exc}") from None
    if precision == "bf16-pure":
        for p in peft_model.parameters():
            if p.requires_grad and p.is_floating_point() and p.dtype != torch.bfloat16:
                p.data = p.data.to(torch.bfloat16)
    return peft_model


def all_fake_model(model) -> bool:
    """True when the model's parameters are fake tensors (a trace)."""
    return optional_libs.all_fake(model.parameters())


def _peft_task(model) -> str | None:
    name = type(model).__name__
    if name.endswith("ForCausalLM"):
        return "CAUSAL_LM"
    if name.endswith("ForSequenceClassification"):
        return "SEQ_CLS"
    return None


def _keep_in_fp32(model, dtype) -> None:
    """The modules a transformers model keeps in fp32 when loaded in `dtype` (modeling_utils `_get_dtype_plan`):
    `_keep_in_fp32_modules` under fp16, `_keep_in_fp32_modules_strict` under fp16 and bf16 (T5's `wo`)."""
    import torch

    keys = list(getattr(model, "_keep_in_fp32_modules_strict", None) or ()) \
        if dtype in (torch.float16, torch.bfloat16) else []
    if dtype == torch.float16:
        keys += list(getattr(model, "_keep_in_fp32_modules", None) or ())
    if not keys:
        return
    for name, module in model.named_modules():
        if name and module_matches(name, keys):
            module.to(torch.float32)


# -- CPU offload of the optimizer state: a transform of a traced step ---------------------------------

def offload_optimizer_state(trace: MemoryTrace) -> MemoryTrace:
    """The step with the optimizer state and the optimizer's own temporaries on the host: their blocks
    leave the device trace; what the optimizer writes back to the parameters stays (in place)."""
    off: set[int] = set()
    for ev in trace.events:
        if ev.action == "alloc" and (ev.category == "optimizer_state"
                                     or (ev.phase == "optimizer" and ev.category == "temporary")):
            off.add(ev.block)
    events: list[MemEvent] = []
    start = 0
    for i, ev in enumerate(trace.events):
        if i == trace.steady_start:
            start = len(events)
        if ev.block not in off:
            events.append(ev)
    if trace.steady_start >= len(trace.events):
        start = len(events)
    notes = list(trace.notes) + ["optimizer state and step offloaded to the CPU (its blocks left out)"]
    return MemoryTrace(events, start, trace.device_type, trace.method, notes, trace.flops_per_step)
