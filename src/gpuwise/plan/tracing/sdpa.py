"""Scaled-dot-product attention as a GPU runs it, for tracing on fake CUDA tensors.

On a CPU-only torch, `F.scaled_dot_product_attention` on fake CUDA tensors can abort the process
(its backend choice asks the CUDA runtime). And the math backend it would fall back to keeps the
(L, S) attention matrix, which flash / memory-efficient attention on a GPU never materialise: they
keep the output and a float32 logsumexp. So, for the cuda target, the call is intercepted and routed
to the aten kernel the GPU would pick, whose meta kernel gives the true output and saved tensors.

Backend choice follows torch/csrc/transformers/cuda/sdp_utils.cpp (`select_sdp_backend`, priority
flash > efficient > math; `check_*` rules), simplified to the rules that decide on sm80+ GPUs.
"""

from __future__ import annotations

import contextlib

from torch.overrides import TorchFunctionMode

# backend -> rule(q, k, v, attn_mask, dropout_p, enable_gqa) -> bool, in torch's priority order
BACKENDS: dict[str, object] = {}


def register_backend(name: str):
    def deco(fn):
        BACKENDS[name] = fn
        return fn
    return deco


@register_backend("flash")
def _flash_ok(q, k, v, attn_mask, dropout_p, enable_gqa) -> bool:
    # sdp_utils.cpp check_for_attn_mask (flash takes no mask), check_head_dim_size_flash (<= 256),
    # check_flash_attention_datatype (fp16/bf16), check_batch_size_and_num_heads_dense (4-D, same heads)
    import torch

    # grouped-query attention (fewer k/v heads, enable_gqa=True): flash reads the shared k/v heads
    # in place on sm80+ (sdp_utils.cpp check_grouped_query_attention), nothing is repeated
    heads_ok = q.shape[1] == k.shape[1] == v.shape[1] or (
        enable_gqa and k.shape[1] == v.shape[1] and q.shape[1] % k.shape[1] == 0)
    return (attn_mask is None and q.dtype in (torch.float16, torch.bfloat16) and q.dim() == 4
            and q.shape[-1] <= 256 and q.shape[-1] == v.shape[-1] and q.shape[-1] % 8 == 0 and heads_ok)


@register_backend("efficient")
def _efficient_ok(q, k, v, attn_mask, dropout_p, enable_gqa) -> bool:
    # sdp_utils.cpp check_head_dim_size_mem_efficient: last dims multiple of 8 (fp16/bf16) / 4 (fp32),
    # check_mem_efficient_attention_datatype: fp32, fp16, bf16 on sm80+
    import torch

    align = 4 if q.dtype == torch.float32 else 8
    return (q.dim() == 4 and q.dtype in (torch.float32, torch.float16, torch.bfloat16)
            and q.shape[-1] % align == 0 and v.shape[-1] % align == 0
            and q.shape[1] == k.shape[1] == v.shape[1] and not enable_gqa)


def choose_backend(q, k, v, attn_mask=None, dropout_p: float = 0.0, enable_gqa: bool = False) -> str:
    for name, ok in BACKENDS.items():
        if ok(q, k, v, attn_mask, dropout_p, enable_gqa):
            return name
    return "math"


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    import torch

    # CUDA autocast casts SDPA's inputs to the autocast dtype before the backend is chosen; the trace
    # runs CPU tensors, so that cast is done here (the CPU autocast state carries the dtype)
    if torch.is_autocast_enabled("cpu"):
        dtype = torch.get_autocast_dtype("cpu")
        q, k, v = (t.to(dtype) if t.is_floating_point() else t for t in (q, k, v))
    backend = choose_backend(q, k, v, attn_mask, dropout_p, enable_gqa)
    if backend == "flash":
        return torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, dropout_p, is_causal, False, scale=scale)[0]
    if backend == "efficient":
        need_grad = q.requires_grad or k.requires_grad or v.requires_grad
        bias = attn_mask
        if bias is not None and bias.dtype == torch.bool:  # efficient takes an additive bias
            bias = torch.zeros(bias.shape, dtype=q.dtype, device=q.device).masked_fill(~bias, float("-inf"))
        if bias is not None:
            bias = bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, bias, need_grad, dropout_p, is_causal, scale=scale)[0]
    return None  # math: let torch decompose it as it would


class _SdpaMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        import torch

        kwargs = kwargs or {}
        if func is torch._C._nn.scaled_dot_product_attention:
            q = args[0]
            if q.device.type in ("cuda", "cpu"):  # CPU tensors stand for CUDA ones while this mode is on
                out = _sdpa(*args, **kwargs)
                if out is not None:
                    return out
                return torch.ops.aten._scaled_dot_product_attention_math(*args, **kwargs)[0]
        return func(*args, **kwargs)


@contextlib.contextmanager
def sdpa_as_gpu_runs_it():
    """Inside: scaled_dot_product_attention runs the kernel a GPU would choose.

    Two hooks: `torch.nn.functional.scaled_dot_product_attention` itself is replaced (what transformers
    and most models call, looked up at call time), because torch-function modes are not active in
    the autograd engine, where activation checkpointing recomputes the forward; and a torch-function
    mode catches callers that imported the builtin before the trace began."""
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention

    def gpu_sdpa(*args, **kwargs):
        out = _sdpa(*args, **kwargs)
        return original(*args, **kwargs) if out is None else out

    F.scaled_dot_product_attention = gpu_sdpa
    try:
        with _SdpaMode():
            yield
    finally:
        F.scaled_dot_product_attention = original
