"""Inference memory: forward-only, and generation with a KV cache at a given batch and context.

The same tracer as training (plan/tracing/trace.py: fake tensors, every storage followed from allocation to
its last reference), over what `model.generate` does for a causal LM, written out so that nothing in
it reads data: under `torch.no_grad()`, a prefill of `context_len` tokens with `use_cache=True` (and
`logits_to_keep=1`, as generate asks; `prefill_logits="all"`: every prompt position's logits, as litgpt's
`GPT.forward` and transformers before 4.45 compute them), then
`new_tokens` decode steps of one token each that append to the cache (transformers' DynamicCache
concatenates, so the old and the grown cache are both alive for a moment). The next token is the
argmax of the last position's logits, as greedy generation takes it; the rest of the logits die.
A workload that is not a causal LM gets the forward-only step: its loss under `torch.no_grad()`.

The weights are cast to `dtype` first (as `from_pretrained(torch_dtype=...)` loads them), outside the
trace. With `quantize` the linear layers' weights are then bitsandbytes' 4-bit (`nf4`, `nf4-dq`, `fp4`, `fp4-dq`:
tracing/quant4bit.py `quantize_linear_4bit`, the layers QLoRA uses, quantized by bitsandbytes under fake
tensors) with `dtype` as the compute dtype, as `from_pretrained(quantization_config=BitsAndBytesConfig(
load_in_4bit=True, ...))` and litgpt's `generate --quantize bnb.nf4` load them. `loader="transformers"`
keeps the output head in 16 bits (`get_keys_to_not_convert`) and quantizes from the load dtype;
`loader="lightning"` is Lightning Fabric's `BitsandbytesPrecision`, which litgpt uses: every `nn.Linear` the
model builds is replaced, the head included, and quantized from a float16 copy (`_Linear4bit.quantize`),
so a dequantized weight comes back in float16 and is cast to the compute dtype. The forward runs
bitsandbytes' own ops (`gemm_4bit` and its fake kernel), so the activations are what it allocates; the
16-bit copy of one layer's weight that the CUDA kernel may dequantize into for a multi-token prefill
(bitsandbytes' dequant + F.linear fallback) is not seen, except for a release before the fused kernels
(`bnb_version`, tracing/bnb_versions.py), where every multi-token matmul took that path. `kv_cache_bytes` is what the cache holds at the end: 2 x layers x batch x kv-heads x tokens x
head-dim x dtype bytes for a standard decoder.

`weights="fp32"` with a 16-bit `dtype` is Lightning's bf16-mixed / 16-mixed generation (litgpt's
`generate --precision bf16-mixed`): the weights stay float32 and every forward call runs under
`torch.autocast(dtype)`, as Fabric's `_FabricModule.forward` wraps it (`precision.forward_context()`), with
CUDA's cast policy. Autocast caches the 16-bit copy of each float32 leaf weight that requires grad
(`cached_cast`; loaded parameters do, and no_grad does not change it) until the outermost autocast exits,
so each forward ends holding a 16-bit copy of every linear weight besides the float32 ones (litgpt's
finetune_lora.md: Llama-2-7B 40.21 GB, 26.95 GB float32 + 13.2 GB of bf16 copies).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from ..errors import GpuwiseError
from ..hf import hf_workload, is_config_source
from ..profiling import cpu_memory_profile
from ..workload import load_workload
from .estimate import resolve_gpu
from .memory.allocator import replay
from .memory.events import MemoryTrace, live_peak
from .memory.overheads import DEFAULT_ARCH, add_workspaces
from .tracing.bnb_versions import bitsandbytes_inference_as, parse_version
from .tracing.cpu_truth import peak_from_profile
from .tracing.cuda_autocast import cuda_autocast_policy
from .tracing.modes import fake_params_set_in_place
from .tracing.quant4bit import QLORA_QUANTS, quantize_linear_4bit
from .tracing.scope import ModuleScope
from .tracing.setup import build_model_for_trace

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
LOADERS = ("transformers", "lightning")   # who quantizes the weights (see the module's docstring)
STEADY_MARK = "gpuwise::inference"


@dataclass
class InferenceEstimate:
    workload: str
    batch_size: int
    context_len: int
    new_tokens: int
    dtype: str
    target: str
    peak_allocated_bytes: int          # live tensor bytes at the peak (cpu) / allocator peak (cuda)
    device_used_bytes: int             # cuda: + caching-allocator and context; cpu: = allocated
    parameters_bytes: int
    kv_cache_bytes: int
    peak_phase: str
    notes: list[str] = field(default_factory=list)
    trace: MemoryTrace | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in (
            "workload", "batch_size", "context_len", "new_tokens", "dtype", "target", "peak_allocated_bytes",
            "device_used_bytes", "parameters_bytes", "kv_cache_bytes", "peak_phase", "notes")}


def _is_causal_lm(model) -> bool:
    return type(model).__name__.endswith("ForCausalLM") and hasattr(model, "config")


def cache_tensors(cache) -> list:
    """Every tensor a transformers cache object holds (DynamicCache layers' keys / values)."""
    import torch

    out, seen = [], set()

    def walk(obj, depth=0):
        if depth > 4 or id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            out.append(obj)
        elif isinstance(obj, (list, tuple)):
            for x in obj:
                walk(x, depth + 1)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            for x in vars(obj).values():
                walk(x, depth + 1)

    walk(cache)
    return out


def _storage_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        st = t.untyped_storage()
        if id(st) not in seen:
            seen.add(id(st))
            total += st.nbytes()
    return total


def run_generation(model, batch, new_tokens: int, mark=None, prefill_logits: str = "last",
                   forward_context=contextlib.nullcontext) -> tuple[Any, int]:
    """Prefill + `new_tokens` greedy decode steps (or a no-grad forward for other models); returns
    (the cache, its bytes). `mark(phase)` is told "prefill" / "decode"; `prefill_logits`: "last" (the
    last position's, as generate asks) or "all" (every position's); `forward_context()` wraps each model
    call (an autocast, as Lightning Fabric wraps its module's forward)."""
    import torch

    mark = mark or (lambda _p: None)

    def call(**kw):
        with forward_context():
            return model(**kw)

    with torch.no_grad():
        if not _is_causal_lm(model):
            mark("forward")
            with forward_context():
                out = model(**batch) if isinstance(batch, dict) else model(batch)
            del out
            return None, 0
        ids = batch["input_ids"] if isinstance(batch, dict) else batch
        mark("prefill")
        try:  # generate() asks for the last position's logits only (transformers >= 4.45); 0 keeps them all
            out = call(input_ids=ids, use_cache=True, logits_to_keep=1 if prefill_logits == "last" else 0)
        except TypeError:
            out = call(input_ids=ids, use_cache=True)
        cache = out.past_key_values
        nxt = out.logits[:, -1:, :].argmax(-1)
        del out
        for _ in range(new_tokens):
            mark("decode")
            out = call(input_ids=nxt, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            nxt = out.logits[:, -1:, :].argmax(-1)
            del out
        nbytes = _storage_bytes(cache_tensors(cache))
        return cache, nbytes


def _cast(model, dtype_name: str):
    import torch

    dtype = getattr(torch, DTYPES[dtype_name])
    if dtype is torch.float32:
        return model
    with fake_params_set_in_place():
        return model.to(dtype)


def estimate_inference(workload, batch_size: int = 1, context_len: int | None = None, new_tokens: int = 1,
                       dtype: str = "bf16", target: str = "cuda", gpu: str | None = None,
                       quantize: str | None = None, loader: str = "transformers",
                       bnb_version: str | None = None, prefill_logits: str = "last",
                       weights: str | None = None) -> InferenceEstimate:
    """Peak memory of a no-grad forward, or for a causal LM of prefill + decoding with a KV cache;
    `quantize` (nf4, nf4-dq, fp4, fp4-dq): bitsandbytes 4-bit linear weights, loaded as `loader` does;
    `bnb_version`: the bitsandbytes release the run used (tracing/bnb_versions.py); `prefill_logits`:
    "last" or "all" positions' logits from the prefill; `weights` "fp32" with a 16-bit `dtype`: float32
    weights, each forward under autocast to `dtype` (Lightning's bf16-mixed / 16-mixed)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .tracing.dispatch import TraceMode
    from .tracing.trace import label, settle

    if dtype not in DTYPES:
        raise GpuwiseError(f"unknown dtype {dtype!r}; choose from: {', '.join(DTYPES)}")
    if quantize is not None and quantize not in QLORA_QUANTS:
        raise GpuwiseError(f"--quantize must be one of {', '.join(QLORA_QUANTS)}, got {quantize!r}")
    if quantize is not None and dtype == "fp32":
        raise GpuwiseError("--quantize: the 4-bit layers compute in 16 bits; give --precision bf16 or fp16")
    if loader not in LOADERS:
        raise GpuwiseError(f"--quantize-by must be one of {', '.join(LOADERS)}, got {loader!r}")
    if (loader != "transformers" or bnb_version) and quantize is None:
        raise GpuwiseError("--quantize-by / --bnb-version apply to --quantize (with --inference)")
    if bnb_version is not None:
        parse_version(bnb_version)
    if weights not in (None, dtype, "fp32"):
        raise GpuwiseError(f"--inference weights must be fp32 (autocast to {dtype}) or {dtype}, got {weights!r}")
    mixed = weights == "fp32" and dtype != "fp32"
    if mixed and quantize is not None:
        raise GpuwiseError("--quantize with float32 weights under autocast: 4-bit weights compute in --precision; "
                           "drop --base-dtype fp32 (litgpt refuses quantization with mixed precision too)")
    if prefill_logits not in ("last", "all"):
        raise GpuwiseError(f"prefill logits must be 'last' or 'all', got {prefill_logits!r}")
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 0:
        raise GpuwiseError(f"new tokens must be a non-negative integer, got {new_tokens!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise GpuwiseError(f"batch size must be a positive integer, got {batch_size!r}")
    if is_config_source(workload):
        workload = hf_workload(workload, context_len)
    wl = load_workload(workload)
    spec = resolve_gpu(gpu)
    tracker = ModuleScope()
    mode = TraceMode(target if target in ("cpu", "cuda") else "cuda", tracker, count_flops=False)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    from .tracing.sdpa import sdpa_as_gpu_runs_it

    with fake_mode, tracker, mode, (sdpa_as_gpu_runs_it() if target == "cuda" else contextlib.nullcontext()):
        with mode.paused():  # weights arrive in `dtype` (from_pretrained(torch_dtype=...)), not traced
            model = _cast(build_model_for_trace(wl, fake_mode, mode), "fp32" if mixed else dtype)
            if quantize is not None:
                quant_type, double_quant = QLORA_QUANTS[quantize]
                fabric = loader == "lightning"
                quantize_linear_4bit(model, compute_dtype=getattr(torch, DTYPES[dtype]), quant_type=quant_type,
                                     double_quant=double_quant, keep_head=not fabric,
                                     from_dtype=torch.float16 if fabric else None)
                for m in model.modules():  # not bitsandbytes' one-off CPU repacking of each weight (eval, no grad)
                    if hasattr(m, "support_avx512bf16_for_cpu") and target == "cuda":
                        m.support_avx512bf16_for_cpu = False
            model.eval()
            batch = wl.build_batch(batch_size)
        label(mode, list(model.parameters()), "parameters", create=True)
        label(mode, list(model.buffers()), "buffers", create=True)
        label(mode, batch, "inputs", create=True)

        def mark(phase):
            mode.phase = "forward"
            marks.append((len(mode.rec.events), phase))

        marks: list[tuple[int, str]] = []
        forward_context = contextlib.nullcontext
        if mixed:
            def forward_context():
                return torch.autocast("cpu", dtype=getattr(torch, DTYPES[dtype]))
        with bitsandbytes_inference_as(bnb_version), contextlib.ExitStack() as stack:
            if mixed and target == "cuda":
                stack.enter_context(cuda_autocast_policy())
            cache, kv_bytes = run_generation(model, batch, new_tokens, mark, prefill_logits, forward_context)
        generates = _is_causal_lm(model)
        kind = type(model).__name__
        if cache is not None:
            label(mode, cache_tensors(cache), "activations")
        events = settle(mode)
        del cache, model, batch
    start = marks[0][0] if marks else 0  # what is alive before generation (weights, inputs) is setup
    trace = MemoryTrace(events, start, target, "fake-trace", notes=[])
    peak = live_peak(trace)
    phase = next((p for at, p in reversed(marks) if at <= peak.event_index), "forward")
    params = peak.by_category.get("parameters", 0)
    notes = [f"weights in {dtype}; no gradients (torch.no_grad)"]
    if mixed:
        notes[0] = (f"weights in fp32, each forward under autocast to {dtype} (bf16-mixed / 16-mixed), which "
                    f"caches a {dtype} copy of every fp32 weight it casts until the forward returns; no gradients")
    if quantize is not None:
        head = ("the output head too, quantized from fp16 (Lightning Fabric)" if loader == "lightning"
                else "the output head in " + dtype)
        notes[0] = (f"linear weights in bitsandbytes {quantize} ({dtype} compute; {head}), the rest in {dtype}; "
                    f"no gradients (torch.no_grad)")
    if not generates and new_tokens:
        notes.append(f"cannot tell generation: {kind} is not a causal LM, so this is one forward over the batch "
                     f"without gradients; its {new_tokens} new tokens (an encoder-decoder's decoder steps and "
                     "their caches) are not modelled")
    if target == "cuda":
        with_ws, overheads = add_workspaces(trace, spec.arch if spec else DEFAULT_ARCH)
        result = replay(with_ws, steady_repeats=1)  # one generation, not a repeated training step
        allocated, used = result.peak_allocated_bytes, result.max_reserved_bytes + overheads.outside_allocator_bytes
    else:
        allocated = used = peak.allocated_bytes
    return InferenceEstimate(wl.spec, batch_size, context_len or getattr(wl, "seq_len", 0), new_tokens, dtype,
                             target, allocated, used, params, kv_bytes, phase, notes, trace)


def measure_inference_cpu(workload, batch_size: int = 1, new_tokens: int = 1, dtype: str = "fp32") -> int:
    """The truth on the CPU: the same generation on real tensors under the profiler; its peak of live
    CPU-allocator bytes from before the model is built (plan/tracing/cpu_truth.py's method)."""
    import torch
    from torch.profiler import record_function

    wl = load_workload(workload)
    torch.manual_seed(0)
    with cpu_memory_profile() as prof:
        model = _cast(wl.build_model(), dtype)
        model.eval()
        batch = wl.build_batch(batch_size)
        with record_function("gpuwise::steady_step"), contextlib.nullcontext():
            cache, _ = run_generation(model, batch, new_tokens)
        del cache, model, batch
    return peak_from_profile(prof).peak_bytes
