"""CUDA's autocast cast policy, applied to the CPU tensors a CUDA-target trace runs on.

The trace runs on CPU tensors (fake or real) standing for CUDA ones, so `torch.autocast` in the step is
the CPU's: its lists differ from CUDA's. On CUDA, `softmax`, `log_softmax`, `layer_norm`, `rms_norm`,
`exp`, `pow`, `rsqrt`, `sum`, the losses and more run in float32 (their outputs are float32 tensors,
saved for backward as such); on the CPU they stay in 16 bits. Inside `cuda_autocast_policy()` the
AutocastCPU dispatch key runs CUDA's policy instead of the CPU's:

- which ops have a CUDA policy is read from the installed torch itself: every `aten` op with an
  `AutocastCUDA` kernel (`torch._C._dispatch_has_kernel_for_dispatch_key`);
- which policy each has comes from the lists those kernels are registered from, aten/src/ATen/autocast_mode.h
  (`AT_FORALL_LOWER_PRECISION_FP`, `AT_FORALL_FP32`, `AT_FORALL_FP32_SET_OPT_DTYPE`,
  `AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE`, `AT_FORALL_PROMOTE`) and autocast_mode.cpp
  (`TORCH_LIBRARY_IMPL(aten, Autocast, m)`: cudnn convolutions, `binary_cross_entropy` banned);
- each policy is the C++ `WrapFunction_` specialisation's, including `cached_cast`'s cache of
  lower-precision copies of fp32 leaf tensors that require grad (the weights), dropped where torch drops
  its own (`torch.clear_autocast_cache`, when the outermost autocast exits);
- ops with a CPU policy and none on CUDA (`cat`, `stack`, `index_copy`, `polar`, `avg_pool3d`, ...) pass
  through unchanged, as on CUDA, where the Autocast key falls through for them; a composite one
  (`cross_entropy_loss`) decomposes with autocast still on, so the ops it calls get their own CUDA
  policies (`nll_loss`: fp32).

Kernels are Python kernels registered on the AutocastCPU key with `torch.library` for the duration of the
context; removing the registrations restores torch's own.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from typing import Any

# aten/src/ATen/autocast_mode.h AT_FORALL_LOWER_PRECISION_FP (+ cudnn_convolution[_transpose] from
# autocast_mode.cpp); entries are "op" or "op.overload", as the dispatcher names them
LOWER_PRECISION_FP = frozenset({
    "_convolution", "_convolution.deprecated", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
    "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu", "addmm", "addmv", "addr",
    "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
    "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell",
    "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
    "cudnn_convolution", "cudnn_convolution_transpose",
})
# AT_FORALL_FP32
FP32 = frozenset({
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
    "native_layer_norm", "group_norm", "rms_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d", "_upsample_nearest_exact2d",
    "upsample_nearest3d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
    "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
})
# AT_FORALL_FP32_SET_OPT_DTYPE: an output dtype the caller did not give becomes float32
FP32_SET_OPT_DTYPE = frozenset({
    "prod", "prod.dim_int", "prod.dim_Dimname", "softmax.int", "softmax.Dimname", "log_softmax.int",
    "log_softmax.Dimname", "cumprod", "cumprod.dimname", "cumsum", "cumsum.dimname", "linalg_vector_norm",
    "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList", "sum.dim_DimnameList",
})
# AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE (fp32_append_dtype): op -> the overload with a dtype it redispatches to
FP32_APPEND_DTYPE = {
    "norm.Scalar": "norm.ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
    "norm.names_ScalarOpt_dim": "norm.names_ScalarOpt_dim_dtype",
}
# AT_FORALL_PROMOTE
PROMOTE = frozenset({
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
    "tensordot", "scatter_add",
})
BANNED = frozenset({"binary_cross_entropy"})

POLICIES = ("lower_precision_fp", "fp32", "fp32_set_opt_dtype", "fp32_append_dtype", "promote", "banned")

# at::autocast::binary_cross_entropy_banned's message (autocast_mode.cpp)
_BANNED_MESSAGE = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast.")


def policy_of(name: str) -> str | None:
    """The CUDA cast policy of an aten op ("mm", "softmax.int"), from autocast_mode.h's lists."""
    if name in BANNED:
        return "banned"
    if name in FP32_APPEND_DTYPE:
        return "fp32_append_dtype"
    for policy, names in (("lower_precision_fp", LOWER_PRECISION_FP), ("fp32", FP32),
                          ("fp32_set_opt_dtype", FP32_SET_OPT_DTYPE), ("promote", PROMOTE)):
        if name in names:
            return policy
    return None


def _registered(key: str) -> list[str]:
    """aten ops ("mm", "softmax.int") that have a kernel of their own on dispatch key `key` in this torch."""
    import torch

    out = []
    for full in torch._C._dispatch_get_all_op_names():
        full = str(full)
        if full.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(full, key):
            out.append(full[len("aten::"):])
    return sorted(out)


_POLICY_CACHE: dict[str, Any] = {}


def cuda_policy() -> dict[str, str]:
    """op -> CUDA cast policy, for every op the installed torch registers an AutocastCUDA kernel for.
    An op torch registers that the lists above do not name maps to "unknown" (tests/test_cuda_autocast.py
    asserts there is none for the installed torch)."""
    if "cuda" not in _POLICY_CACHE:
        _POLICY_CACHE["cuda"] = {name: policy_of(name) or "unknown" for name in _registered("AutocastCUDA")}
    return dict(_POLICY_CACHE["cuda"])


def cpu_policy_ops() -> list[str]:
    """ops the installed torch gives an AutocastCPU kernel (their CPU policy is replaced inside the context)."""
    if "cpu" not in _POLICY_CACHE:
        _POLICY_CACHE["cpu"] = _registered("AutocastCPU")
    return list(_POLICY_CACHE["cpu"])


class _CastCache:
    """at::autocast's cached_cast cache: lower-precision copies of fp32 leaf tensors that require grad."""

    def __init__(self):
        self.casts: dict[int, tuple[Any, Any]] = {}

    def clear(self) -> None:
        self.casts.clear()

    def cast(self, t, to_type, lower):
        import torch

        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dtype in (torch.float64, to_type):
            return t  # is_eligible: a defined floating-point tensor, not double; nothing to do at to_type
        can_cache = (to_type == lower and t.dtype == torch.float32 and t.requires_grad and t.is_leaf
                     and not t._is_view() and torch.is_autocast_cache_enabled())
        if not can_cache:
            return t.to(to_type)
        entry = self.casts.get(id(t))
        if entry is not None and entry[0]() is t:
            return entry[1]
        out = t.to(to_type)
        self.casts[id(t)] = (weakref.ref(t), out)
        return out


def _map(fn, value):
    if isinstance(value, (list, tuple)):
        return type(value)(_map(fn, v) for v in value)
    return fn(value)


def _tensors(value):
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def _eligible(t) -> bool:
    import torch

    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


def _make_kernel(op, policy: str, cache: _CastCache):
    """A Python AutocastCPU kernel for `op` with CUDA's `policy` (autocast_mode.h WrapFunction_)."""
    import torch

    exclude = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
    dtype_index = next((i for i, a in enumerate(op._schema.arguments) if a.name == "dtype"), None)
    target = None
    if policy == "fp32_append_dtype":
        overload = FP32_APPEND_DTYPE[f"{op._schema.name.split('::')[-1]}.{op._overloadname}"].split(".")[1]
        target = getattr(op.overloadpacket, overload)

    # An op with no CUDA policy is a fallthrough on AutocastCUDA: a composite op (cross_entropy_loss) then
    # decomposes with autocast still on, so the ops it calls get their own CUDA policies (nll_loss: fp32)
    composite = policy == "passthrough" and torch._C._dispatch_has_kernel_for_dispatch_key(
        op.name(), "CompositeImplicitAutograd")

    def kernel(*args, **kwargs):
        if composite:
            return op.decompose(*args, **kwargs)
        lower = torch.get_autocast_dtype("cpu")
        with torch._C._ExcludeDispatchKeyGuard(exclude):
            if policy == "lower_precision_fp":
                cast = lambda t: cache.cast(t, lower, lower)  # noqa: E731
            elif policy == "fp32":
                cast = lambda t: cache.cast(t, torch.float32, lower)  # noqa: E731
            elif policy == "promote":
                wide = any(t.dtype == torch.float32 for t in _tensors((args, kwargs)) if _eligible(t))
                to_type = torch.float32 if wide else lower
                cast = lambda t: cache.cast(t, to_type, lower)  # noqa: E731
            elif policy == "fp32_set_opt_dtype":
                if args and _eligible(args[0]):
                    if dtype_index is not None and len(args) > dtype_index:
                        if args[dtype_index] is None:
                            args = (*args[:dtype_index], torch.float32, *args[dtype_index + 1:])
                    elif kwargs.get("dtype") is None:
                        kwargs = {**kwargs, "dtype": torch.float32}
                return op(*args, **kwargs)
            elif policy == "fp32_append_dtype":
                out_type = torch.float32 if args and _eligible(args[0]) else args[0].dtype
                return target(*args, **kwargs, dtype=out_type)
            elif policy == "banned":
                raise RuntimeError(_BANNED_MESSAGE)
            else:  # an op with a CPU policy and none on CUDA: as CUDA runs it, uncast
                return op(*args, **kwargs)
            return op(*_map(cast, args), **{k: _map(cast, v) for k, v in kwargs.items()})

    return kernel


def _op(name: str):
    import torch

    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base)
    return getattr(packet, overload or "default")


_ACTIVE = [0]  # cuda_autocast_policy contexts entered and not left


def cuda_policy_active() -> bool:
    """Whether `torch.autocast("cpu", ...)` applies CUDA's policy now (inside `cuda_autocast_policy`)."""
    return _ACTIVE[0] > 0


@contextlib.contextmanager
def cuda_autocast_policy():
    """Inside: `torch.autocast("cpu", dtype)` applies CUDA's cast policy, op for op (see the module doc)."""
    import torch

    policy = cuda_policy()
    cache = _CastCache()
    lib = torch.library.Library("aten", "IMPL")
    original_clear = torch.clear_autocast_cache

    def clear_autocast_cache():
        cache.clear()
        original_clear()

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"(?s).*Overriding a previously registered kernel")
            for name in sorted(set(policy) | set(cpu_policy_ops())):
                try:
                    op = _op(name)
                except (AttributeError, RuntimeError):
                    continue
                kind = policy.get(name, "passthrough")
                if kind == "unknown":
                    kind = "passthrough"
                lib.impl(name, _make_kernel(op, kind, cache), "AutocastCPU")
        torch.clear_autocast_cache = clear_autocast_cache
        _ACTIVE[0] += 1
        try:
            yield policy
        finally:
            _ACTIVE[0] -= 1
    finally:
        torch.clear_autocast_cache = original_clear
        cache.clear()
        lib._destroy()
