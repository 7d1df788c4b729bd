"""Scaled-dot-product attention as a GPU runs it, for tracing on fake CUDA tensors.

On a CPU-only torch, `F.scaled_dot_product_attention` on fake CUDA tensors can abort the process
(its backend choice asks the CUDA runtime). And the math backend it would fall back to keeps the
(L, S) attention matrix, which flash / memory-efficient attention on a GPU never materialise: they
keep the output and a float32 logsumexp. So, for the cuda target, the call is intercepted and routed
to the aten kernel the GPU would pick, whose meta kernel gives the true output and saved tensors.

Backend choice follows torch/csrc/transformers/cuda/sdp_utils.cpp (`select_sdp_backend`, priority
flash > efficient > math; the `check_*` rules below, each named after torch's), for the target GPU's
compute capability (`attention_target`, set by the estimate from the catalog; sm80 when no GPU is
named). Every choice is recorded with its reason (`decisions()`), for the estimate's notes and JSON.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field

from torch.overrides import TorchFunctionMode

from ...errors import GpuwiseError

DEFAULT_CAPABILITY = (8, 0)
KERNELS = ("flash", "efficient", "math")


@dataclass
class AttentionTarget:
    """What decides the kernel besides the tensors: the GPU and a kernel the user forces."""

    capability: tuple[int, int] = DEFAULT_CAPABILITY
    gpu: str = ""
    attn: str | None = None             # --attn: eager / sdpa / flash / triton (None: the model's own default)
    decisions: dict[tuple[str, str], int] = field(default_factory=dict)  # (kernel, why) -> calls
    implementation: str | None = None   # the traced model's config._attn_implementation (transformers)
    calls: dict[SdpaCall, int] = field(default_factory=dict)  # what the rules read of each call -> calls

    @property
    def force(self) -> str | None:
        """"flash": the flash kernel forced (torch.nn.attention.sdpa_kernel(FLASH_ATTENTION)), as --attn flash;
        --attn triton runs a FlashAttention kernel written in Triton: the same tensors as flash, its own speed."""
        return "flash" if self.attn in ("flash", "triton") else None


@dataclass(frozen=True)
class TensorMeta:
    """What the backend rules read of one tensor."""

    shape: tuple[int, ...]
    dtype: object
    requires_grad: bool
    last_stride: int = 1  # stride(-1): the fused kernels read rows of stride 1 only

    @classmethod
    def of(cls, t) -> TensorMeta:
        return cls(tuple(t.shape), t.dtype, bool(t.requires_grad), int(t.stride(-1)))

    def dim(self) -> int:
        return len(self.shape)

    def stride(self, dim: int) -> int:
        if dim != -1:
            raise ValueError("only the last dimension's stride is kept")
        return self.last_stride


@dataclass(frozen=True)
class SdpaCall:
    """One scaled_dot_product_attention call as the backend rules see it: kept with a trace, so that
    `same_kernels` can tell whether a GPU of another compute capability would run the same kernels."""

    q: TensorMeta
    k: TensorMeta
    v: TensorMeta
    mask: TensorMeta | None
    enable_gqa: bool
    force: str | None


_TARGET: contextvars.ContextVar[AttentionTarget | None] = contextvars.ContextVar("gpuwise_attention", default=None)


@contextlib.contextmanager
def attention_target(capability: tuple[int, int] | None = None, gpu: str = "", attn: str | None = None):
    """Inside: SDPA kernels are chosen for a GPU of this compute capability and models get `attn`; yields
    the AttentionTarget whose `decisions` fill as attention runs."""
    if attn is not None and attn not in ATTN_CHOICES:
        raise GpuwiseError(f"unknown attention {attn!r}; choose from: {', '.join(ATTN_CHOICES)}")
    target = AttentionTarget(capability or DEFAULT_CAPABILITY, gpu, attn)
    token = _TARGET.set(target)
    try:
        yield target
    finally:
        _TARGET.reset(token)


@contextlib.contextmanager
def using_target(target: AttentionTarget):
    """Inside: `target` (one estimate's, shared by all its traces) decides and records the kernels."""
    token = _TARGET.set(target)
    try:
        yield target
    finally:
        _TARGET.reset(token)


def current_target() -> AttentionTarget:
    return _TARGET.get() or AttentionTarget()


def active_target() -> AttentionTarget | None:
    """The target set by `attention_target` / `using_target` around this trace, if any."""
    return _TARGET.get()


def _sm(cap: tuple[int, int]) -> str:
    return f"sm{cap[0]}{cap[1]}"


FLASH_BACKWARD_192 = ((8, 6), (8, 7), (8, 9), (12, 0))  # flash backward takes head dim <= 192 there


def kernel_class(capability: tuple[int, int] | None) -> tuple[bool, ...]:
    """What of a compute capability the rules below read: GPUs of one class get the same kernels for the
    same inputs (fit traces once per class), only the reasons name the sm."""
    cap = capability or DEFAULT_CAPABILITY
    return ((5, 0) <= cap <= (12, 1), (8, 0) <= cap <= (12, 1), cap < (8, 0), cap in FLASH_BACKWARD_192)


# backend -> rule(q, k, v, attn_mask, dropout_p, enable_gqa, capability) -> None when it runs, else why not,
# in torch's priority order
BACKENDS: dict[str, object] = {}


def register_backend(name: str):
    def deco(fn):
        BACKENDS[name] = fn
        return fn
    return deco


@register_backend("flash")
def _flash_why_not(q, k, v, attn_mask, dropout_p, enable_gqa, cap=DEFAULT_CAPABILITY) -> str | None:
    import torch

    if not (8, 0) <= cap <= (12, 1):  # check_flash_attention_hardware_support
        return f"flash needs sm80..sm121, {_sm(cap)} has none"
    if attn_mask is not None:  # check_for_attn_mask
        return "flash takes no attention mask (an explicit mask is given)"
    if q.dtype not in (torch.float16, torch.bfloat16):  # check_flash_attention_datatype
        return f"flash runs fp16/bf16 only, the inputs are {str(q.dtype).replace('torch.', '')}"
    if q.dim() != 4:  # check_tensor_shapes
        return "flash needs 4-D inputs"
    if q.shape[-1] != 1 and not _rows_contiguous(q, k, v):  # check_last_dim_stride_equals_1_dense<true>
        return "flash needs q, k, v with stride 1 in their last dimension"
    if q.shape[-1] > 256 or q.shape[-1] != v.shape[-1] or q.shape[-1] % 8:  # check_head_dim_size_flash
        return f"flash needs head dim <= 256, a multiple of 8 (head dim {q.shape[-1]})"
    if cap in FLASH_BACKWARD_192 and q.shape[-1] > 192 and q.requires_grad:
        return f"flash backward on {_sm(cap)} takes head dim <= 192"  # ..._gt192_constraints_on_sm86_89_or_120
    # grouped-query attention (fewer k/v heads, enable_gqa=True): flash reads the shared k/v heads
    # in place on sm80+ (check_grouped_query_attention), nothing is repeated
    heads_ok = q.shape[1] == k.shape[1] == v.shape[1] or (
        enable_gqa and k.shape[1] == v.shape[1] and q.shape[1] % k.shape[1] == 0)
    if not heads_ok:  # check_batch_size_and_num_heads_dense
        return "flash needs equal heads (or grouped-query heads with enable_gqa)"
    return None


@register_backend("efficient")
def _efficient_why_not(q, k, v, attn_mask, dropout_p, enable_gqa, cap=DEFAULT_CAPABILITY) -> str | None:
    import torch

    if not (5, 0) <= cap <= (12, 1):  # check_mem_efficient_hardware_support
        return f"memory-efficient attention needs sm50..sm121, not {_sm(cap)}"
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16) or (q.dtype == torch.bfloat16 and cap < (8, 0)):
        return f"memory-efficient attention does not run {str(q.dtype).replace('torch.', '')} on {_sm(cap)}"
    align = 4 if q.dtype == torch.float32 else 8  # check_head_dim_size_mem_efficient
    if q.dim() != 4 or q.shape[-1] % align or v.shape[-1] % align:
        return f"memory-efficient attention needs 4-D inputs, head dim a multiple of {align}"
    if not q.shape[1] == k.shape[1] == v.shape[1] or enable_gqa:  # no grouped-query support
        return "memory-efficient attention takes no grouped-query heads"
    # check_last_dim_stride_equals_1_dense<false>: on a GPU the mask's rows too (a bias made by permuting,
    # as T5's relative position bias (1, heads, q, k) from a (q, k, heads) embedding, has stride heads)
    if not _rows_contiguous(q, k, v):
        return "memory-efficient attention needs q, k, v with stride 1 in their last dimension"
    if attn_mask is not None and attn_mask.stride(-1) != 1:
        return (f"memory-efficient attention needs the mask's last dimension at stride 1 (stride "
                f"{attn_mask.stride(-1)}: a .contiguous() copy of the mask would let it run, without the scores)")
    return None


def _rows_contiguous(*tensors) -> bool:
    return all(t.stride(-1) == 1 for t in tensors)


def choose_backend(q, k, v, attn_mask=None, dropout_p: float = 0.0, enable_gqa: bool = False,
                   capability: tuple[int, int] | None = None, force: str | None = None) -> tuple[str, str]:
    """(kernel, why): the kernel torch's dispatcher picks for these inputs on a GPU of `capability`."""
    cap = capability or current_target().capability
    passed = []
    for name, why_not in BACKENDS.items():
        if force is not None and name != force:
            continue
        reason = why_not(q, k, v, attn_mask, dropout_p, enable_gqa, cap)
        if reason is None:
            forced = " (forced)" if force else ""
            return name, f"{name}{forced} on {_sm(cap)}" + (f"; {'; '.join(passed)}" if passed else "")
        passed.append(reason)
    if force is not None:
        return "math", f"{force} was asked for but cannot run: {'; '.join(passed)}; math kernel instead"
    return "math", "; ".join(passed)


def same_kernels(calls, capability: tuple[int, int], other: tuple[int, int]) -> bool:
    """Whether every call of `calls` (an AttentionTarget's) runs the same kernel on both compute
    capabilities: then a trace made for one is the other's too (attention is the only thing a trace
    takes from the GPU's capability)."""
    return all(choose_backend(c.q, c.k, c.v, c.mask, 0.0, c.enable_gqa, capability, c.force)[0]
               == choose_backend(c.q, c.k, c.v, c.mask, 0.0, c.enable_gqa, other, c.force)[0]
               for c in calls)


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    import torch

    q, k, v = _autocast_inputs(q, k, v)
    target = current_target()
    backend, why = choose_backend(q, k, v, attn_mask, dropout_p, enable_gqa, target.capability, target.force)
    target.decisions[(backend, why)] = target.decisions.get((backend, why), 0) + 1
    call = SdpaCall(TensorMeta.of(q), TensorMeta.of(k), TensorMeta.of(v),
                    None if attn_mask is None else TensorMeta.of(attn_mask), bool(enable_gqa), target.force)
    target.calls[call] = target.calls.get(call, 0) + 1
    if attn_mask is not None and attn_mask.dtype == torch.bool:  # convert_boolean_attn_mask, once the kernel is chosen
        attn_mask = _additive(attn_mask, q.dtype)
    if backend == "flash":
        return torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, dropout_p, is_causal, False, scale=scale)[0]
    if backend == "efficient":
        need_grad = q.requires_grad or k.requires_grad or v.requires_grad
        bias = attn_mask
        if bias is not None:
            bias = bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, bias, need_grad, dropout_p, is_causal, scale=scale)[0]
    return _math(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


class _SdpaMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        import torch

        kwargs = kwargs or {}
        if func is torch._C._nn.scaled_dot_product_attention:
            q = args[0]
            if q.device.type in ("cuda", "cpu"):  # CPU tensors stand for CUDA ones while this mode is on
                return _sdpa(*args, **kwargs)
        return func(*args, **kwargs)


def _autocast_inputs(q, k, v):
    """CUDA autocast casts SDPA's inputs to the autocast dtype before the backend is chosen; the trace
    runs CPU tensors, so that cast is done here (the CPU autocast state carries the dtype)."""
    import torch

    if not torch.is_autocast_enabled("cpu"):
        return q, k, v
    dtype = torch.get_autocast_dtype("cpu")
    return tuple(t.to(dtype) if t.is_floating_point() else t for t in (q, k, v))


def _math(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """The math kernel, as a GPU falls back to it (the (L, S) scores kept). Called directly, not through
    the builtin: under checkpointing the recompute runs in the autograd engine, where the mode above is
    off, and the builtin would pick a CPU kernel with other saved tensors than the forward's."""
    import torch

    # CUDA's autocast casts SDPA's inputs (_sdpa above) and runs the whole kernel with autocast off, so the
    # math kernel's matmuls stay in its upcast float32; the trace's CPU autocast would cast them down
    with torch.autocast("cpu", enabled=False):
        return _math_as_cuda_runs_it(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def _math_as_cuda_runs_it(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """aten's `_scaled_dot_product_attention_math` (transformers/attention.cpp) step by step, as it runs on
    CUDA tensors. Run on the trace's fake CPU tensors the C++ differs twice: its `at::dropout` takes the fused
    `native_dropout` (a bool mask saved) only on CUDA tensors, and decomposes on CPU ones into a noise tensor of
    the scores' dtype (float32: 4 bytes an element of every (L, S) score instead of 1); and it adds the mask
    out of place to a tensor subclass (a fake tensor), in place to a real one (an extra (L, S) scores tensor
    at the add). The rest as the C++ does it: fp16/bf16 inputs upcast to float32 unless allowed to reduce in
    half precision, the scale split between q and k, the safe softmax, the result cast back."""
    import math

    import torch

    origin = q.dtype
    # the upcast landed in July 2024 (pytorch#128922, for 2.4), its off switch in 2.5 (pytorch#135964:
    # torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp)
    reduce_in_half = getattr(torch._C, "_get_math_sdp_allow_fp16_bf16_reduction", None)
    if origin in (torch.float16, torch.bfloat16) and not (reduce_in_half is not None and reduce_in_half()):
        q, k, v = q.float(), k.float(), v.float()
    factor = math.sqrt(scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    if is_causal:
        attn_mask = _additive(torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(), q.dtype)
    if enable_gqa and k.shape[-3] != q.shape[-3]:  # pre_process_group_query_attention_input
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    attn = torch.matmul(q * factor, k.transpose(-2, -1) * factor)
    if attn_mask is not None:
        attn.add_(attn_mask)
    softmax = getattr(torch.ops.aten, "_safe_softmax", None)
    attn = softmax(attn, -1) if softmax is not None else torch.softmax(attn, -1)
    if dropout_p > 0.0:
        attn = torch.ops.aten.native_dropout(attn, dropout_p, True)[0]
    return torch.matmul(attn, v).to(origin)


def _additive(mask, dtype):
    """convert_boolean_attn_mask (sdp_utils_cpp): a bool mask (True = attend) as 0 / -inf of `dtype`."""
    import torch

    return torch.where(mask.logical_not(), float("-inf"), torch.zeros((), dtype=dtype))


@contextlib.contextmanager
def sdpa_as_gpu_runs_it(catch_builtin: bool = True):
    """Inside: scaled_dot_product_attention runs the kernel a GPU would choose.

    Two hooks: `torch.nn.functional.scaled_dot_product_attention` itself is replaced (what transformers
    and most models call, looked up at call time), because torch-function modes are not active in
    the autograd engine, where activation checkpointing recomputes the forward; and a torch-function
    mode catches callers that imported the builtin before the trace began. That mode makes every torch
    call a Python round trip: `catch_builtin=False` leaves it to the caller, which enters
    `builtin_sdpa_caught()` only where the model runs (plan/tracing/trace.py: the step's forward)."""
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention

    F.scaled_dot_product_attention = _sdpa
    try:
        with _SdpaMode() if catch_builtin else contextlib.nullcontext(), unpacked_sequences():
            yield
    finally:
        F.scaled_dot_product_attention = original


def builtin_sdpa_caught():
    """Inside: calls of the builtin `torch._C._nn.scaled_dot_product_attention` run the kernel a GPU would
    choose (the torch-function mode of `sdpa_as_gpu_runs_it`, for a caller that turned it off there)."""
    return _SdpaMode()


@contextlib.contextmanager
def unpacked_sequences():
    """Inside: transformers sees the traced batch as the real run does, one sequence per row.

    transformers (masking_utils.find_packed_sequence_indices, >= 4.54) looks at the position ids for
    packed sequences; on a fake tensor it cannot read them, so it assumes packing (as under torch.compile),
    builds an explicit (L, L) mask and passes it to SDPA: the flash kernel is then ruled out and the
    efficient kernel runs the full (non-causal) square. A real eager run reads the ids (the model's own
    arange: gpuwise's batches pass no position ids), finds no packing, passes no mask and `is_causal=True`,
    and SDPA picks flash on sm80+. So for fake position ids the answer is the real run's: no packing."""
    try:
        from transformers import masking_utils
    except Exception:  # noqa: BLE001 - no transformers, or one without the packing check
        yield
        return
    original = getattr(masking_utils, "find_packed_sequence_indices", None)
    if original is None:
        yield
        return
    from torch._subclasses.fake_tensor import FakeTensor

    def find_packed(position_ids):
        return None if isinstance(position_ids, FakeTensor) else original(position_ids)

    masking_utils.find_packed_sequence_indices = find_packed
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


@contextlib.contextmanager
def padding_read_from_batch(fake_batch, real_batch):
    """Inside: transformers decides whether a 2-D attention mask has padding from the real batch's values.

    On a GPU, transformers' mask code (masking_utils.sdpa_mask, >= 4.53) drops a padding mask in which
    every position is kept (`_ignore_bidirectional_mask_sdpa` / `_ignore_causal_mask_sdpa`: `padding_mask.all()`),
    so SDPA gets no mask and picks flash (fp16/bf16) or memory-efficient attention without a bias. On a fake
    tensor it cannot read the values (`is_tracing` is true for a FakeTensor), keeps the mask, builds the
    (B, 1, L, S) bias and rules flash out. So when the mask handed to the model is one of the batch's own
    tensors, its values are read from the same batch built for real (`real_batch()`, called once, only when a
    mask is checked): no padding gives the real run's answer (no mask); padding, or a mask the model derived
    itself, keeps the fake answer (the mask is kept)."""
    try:
        from transformers import masking_utils
    except Exception:  # noqa: BLE001 - no transformers
        yield
        return
    original = getattr(masking_utils, "_preprocess_mask_arguments", None)
    if original is None:  # transformers before masking_utils (< 4.53)
        yield
        return
    import inspect

    import torch
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
    from torch.utils._pytree import tree_leaves

    position = {id(t): i for i, t in enumerate(tree_leaves(fake_batch)) if isinstance(t, torch.Tensor)}
    signature = inspect.signature(original)
    no_padding: dict[int, bool] = {}
    real: list = []

    def unpadded(mask) -> bool:
        i = position.get(id(mask))
        if i is None or mask.dim() != 2:
            return False
        if i not in no_padding:
            with unset_fake_temporarily():
                if not real:
                    real.append(tree_leaves(real_batch()))
                leaf = real[0][i] if i < len(real[0]) else None
                no_padding[i] = (isinstance(leaf, torch.Tensor) and tuple(leaf.shape) == tuple(mask.shape)
                                 and bool(leaf.bool().all()))
        return no_padding[i]

    def preprocess(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        mask = bound.arguments.get("attention_mask")
        if isinstance(mask, FakeTensor) and unpadded(mask):
            bound.arguments["attention_mask"] = None  # what sdpa_mask makes of a mask with no padding
        return original(*bound.args, **bound.kwargs)

    masking_utils._preprocess_mask_arguments = preprocess
    try:
        yield
    finally:
        masking_utils._preprocess_mask_arguments = original


# --attn: transformers' attn_implementation (config._attn_implementation) as the model is built
ATTN_CHOICES = {
    "eager": "the model's own attention code: the (L, L) scores and probabilities are kept (transformers < 4.36)",
    "sdpa": "torch's scaled_dot_product_attention: the kernel its dispatcher picks for the GPU (transformers >= 4.36)",
    "flash": "scaled_dot_product_attention with the flash kernel forced (sm80+, fp16/bf16; as flash_attention_2)",
    "triton": "a FlashAttention kernel written in Triton (llm-foundry's attn_impl: triton): flash's tensors, "
              "priced at that kernel's published speed (plan/speed/attention.py)",
}


def set_attn_implementation(model, target: AttentionTarget) -> str | None:
    """Give a transformers model the target's `attn` ("eager" / "sdpa"; "flash" runs sdpa with the flash
    kernel forced) and record the implementation it runs. Returns a note for a model that has no such
    setting (not a transformers model), else None."""
    config = getattr(model, "config", None)
    is_hf = config is not None and hasattr(config, "_attn_implementation") and hasattr(model, "set_attn_implementation")
    if target.attn is not None:
        impl = "sdpa" if target.attn in ("flash", "triton") else target.attn
        if not is_hf:
            return f"--attn {target.attn}: not a transformers model; its attention code runs as written"
        if config._attn_implementation != impl:
            model.set_attn_implementation(impl)
    target.implementation = config._attn_implementation if is_hf else None
    return None


def attention_note(target: AttentionTarget) -> str:
    """One line: which attention kernel(s) the trace assumed and why."""
    impl = f"attn_implementation {target.implementation}: " if target.implementation else ""
    if not target.decisions:
        if target.implementation not in (None, "sdpa"):
            return (f"attention: {impl}the model's own attention code, no scaled_dot_product_attention call "
                    "(the (L, L) scores are kept)")
        return f"attention: {impl}no scaled_dot_product_attention call in the step"
    kinds = "; ".join(why for (_kernel, why) in target.decisions)
    return f"attention: {impl}{kinds}"


def attention_summary(target: AttentionTarget) -> dict:
    """The estimate's JSON `attention` object: implementation, kernels chosen and why."""
    kernels = sorted({k for k, _ in target.decisions}, key=KERNELS.index)
    return {"implementation": target.implementation, "requested": target.attn, "kernels": kernels,
            "why": [why for _, why in target.decisions],
            "compute_capability": f"{target.capability[0]}.{target.capability[1]}"}
