"""What the GPU runs in one step, as the trace saw it: GEMM shapes, attention kernels, bytes of the
memory-bound ops, and kernel counts, per phase. The trace's dispatch mode calls `OpCosts.record` for
every aten op of the steady-state step; the speed model (plan/speed/model.py) prices them.

Keys are hashable tuples and values counts, so two traces combine linearly: a model rebuilt from 3
and 4 traced blocks (plan/repeat.py) gets `c3 + (L - 3) x (c4 - c3)`, like its FLOPs.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .batchnorm import batch_norm_traffic
from .composite_ops import cudnn_rnn_gemms, cudnn_rnn_pointwise, grouped_mm_gemm, grouped_mm_operands
from .fusion import FUSED_PHASES, Fusion, block_of
from .fusion import touched_bytes as _bytes
from .gemm import ALIGN_BYTES

GEMM_OPS = {"aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten._scaled_mm"}
CONV_OPS = {"aten.convolution", "aten.convolution_backward", "aten.cudnn_convolution"}
# SDPA's fused kernels, forward and backward (torch/_meta_registrations.py names them)
ATTENTION_KERNELS = {
    "aten._scaled_dot_product_flash_attention": "flash",
    "aten._scaled_dot_product_flash_attention_backward": "flash",
    "aten._flash_attention_forward": "flash",
    "aten._flash_attention_backward": "flash",
    "aten._scaled_dot_product_efficient_attention": "efficient",
    "aten._scaled_dot_product_efficient_attention_backward": "efficient",
    "aten._efficient_attention_forward": "efficient",
    "aten._efficient_attention_backward": "efficient",
    "aten._scaled_dot_product_cudnn_attention": "cudnn",
    "aten._scaled_dot_product_cudnn_attention_backward": "cudnn",
}
# batch norm, forward and backward (training: statistics + normalise passes; plan/speed/batchnorm.py)
BATCH_NORM_FORWARD = {"aten.native_batch_norm", "aten._native_batch_norm_legit", "aten._native_batch_norm_legit_functional",
                      "aten._batch_norm_with_update", "aten._batch_norm_with_update_functional",
                      "aten.cudnn_batch_norm", "aten.miopen_batch_norm"}
BATCH_NORM_BACKWARD = {"aten.native_batch_norm_backward", "aten.batch_norm_backward", "aten.cudnn_batch_norm_backward",
                       "aten.miopen_batch_norm_backward"}
# cuDNN's RNN (plan/tracing/cudnn_rnn.py): priced as the GEMMs and pointwise kernels it runs (composite_ops.py)
CUDNN_RNN_OPS = {"aten._cudnn_rnn", "aten._cudnn_rnn_backward"}
GROUPED_MM_NAME = "aten._grouped_mm"  # mixture-of-experts GEMMs: composite_ops.py `grouped_mm_gemm`, `grouped_mm_flops`
# no kernel at all: allocation or a host-side read
NO_KERNEL_OPS = {"aten.empty", "aten.empty_strided", "aten.empty_like", "aten._local_scalar_dense",
                 "aten.lift_fresh", "aten.set_", "aten.resize_", "aten.sym_size", "aten.sym_stride"}
# ops that read, of one operand (at this position), only the elements an index picks: a gather, an embedding
# lookup, the loss at each target (nll_loss: one element per target row), or none of it (nll_loss_backward
# writes -grad_output at each target into its zero-filled grad_input, aten/src/ATen/native/cuda/Loss.cu, and
# never reads the log-probabilities); their other operands and outputs count whole
INDEXED_OPERAND = {"aten.gather": 0, "aten.index_select": 0, "aten.embedding": 0, "aten.nll_loss_forward": 0,
                   "aten.nll_loss2d_forward": 0, "aten.nll_loss_backward": 1, "aten.nll_loss2d_backward": 1}
COPY_OPS = {"aten._to_copy", "aten.copy_"}  # TensorIterator copies without the pointwise tag
# torch's multi_tensor_apply launches one kernel per chunk of tensors: at most 110 / 64 / 48 / 36 / 30
# tensors for 1..5 tensor lists (aten/src/ATen/native/cuda/MultiTensorApply.cuh depth_to_max_tensors)
FOREACH_MAX_TENSORS = (110, 64, 48, 36, 30)


@dataclass
class OpCosts:
    # (phase, batch, m, n, k, itemsize, aligned: every operand 16-byte aligned, gemm.py) -> calls
    gemms: Counter = field(default_factory=Counter)
    attention: Counter = field(default_factory=Counter)   # (phase, kernel, query itemsize) -> FLOPs
    # the same FLOPs by problem, where the call's (batch, heads, seq, head dim) query says it (attention.py prices
    # them by shape): (phase, kernel, query itemsize, seq_q, seq_k, head_dim, causal) -> FLOPs
    attention_shapes: Counter = field(default_factory=Counter)
    # (phase, FLOPs, bytes read + written, bytes of its NCHW activations, operand itemsize) -> calls
    convs: Counter = field(default_factory=Counter)
    # depthwise convolutions (plan/speed/conv.py depthwise_s), one key per kernel:
    # (phase, pass: "forward" | "data" | "weight", FLOPs, bytes read + written, operand itemsize) -> calls
    depthwise: Counter = field(default_factory=Counter)
    # phase -> bytes read + written by other kernels; (phase, path) -> those of the slower paths (_kernel_path)
    memory_bytes: Counter = field(default_factory=Counter)
    kernels: Counter = field(default_factory=Counter)     # phase -> kernels launched (all kinds)
    host_ops: Counter = field(default_factory=Counter)    # phase -> aten ops dispatched (views included)
    # (phase, implementation) -> bytes its passes over the activations move (plan/speed/batchnorm.py)
    batch_norms: Counter = field(default_factory=Counter)
    input_bytes: Counter = field(default_factory=Counter)  # phase -> bytes of the batch copied host -> device
    # what a fusing compiler leaves of the forward's and backward's memory-bound ops (plan/speed/fusion.py,
    # priced under --compile by `compiled`): phase -> bytes its kernels move, its kernels, the eager kernels they
    # replace
    fused_bytes: Counter = field(default_factory=Counter)
    fused_kernels: Counter = field(default_factory=Counter)
    memory_kernels: Counter = field(default_factory=Counter)
    _fusion: Fusion | None = field(default=None, repr=False, compare=False)

    PARTS = ("gemms", "attention", "attention_shapes", "convs", "depthwise", "memory_bytes", "kernels", "host_ops",
             "batch_norms", "input_bytes", "fused_bytes", "fused_kernels", "memory_kernels")

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fusion": None}  # the dataflow state is the trace's, not the result's

    def record(self, name: str, phase: str, args: tuple, kwargs: dict, out: Any, flops: int, func: Any = None,
               module: str = "") -> None:
        """One aten op of the steady step (`name` as 'aten.mm'; `flops` from torch's flop formulas; `func`
        the OpOverload, whose schema says where `is_causal` is; `module` the module running it, whose block
        bounds a fusing compiler's regions: plan/speed/fusion.py)."""
        self.host_ops[phase] += 1
        if self._fusion is None:
            self._fusion = Fusion(self.fused_bytes, self.fused_kernels, self.memory_kernels)
        self._fusion.at(phase)
        if not _launches(name, args, out):
            return
        fused = phase in FUSED_PHASES
        memory_before = sum(self.memory_bytes.values()) if fused else 0
        if name in GEMM_OPS:
            self.gemms[(phase, *_gemm_shape(name, args, out))] += 1
            self.kernels[phase] += 1
        elif name == GROUPED_MM_NAME:
            a, b, _, _ = grouped_mm_operands(args, kwargs)
            batch, m, n, k, itemsize = grouped_mm_gemm(args, kwargs)
            aligned = all(_aligned(t) for t in _tensors((a, b, out)))
            self.gemms[(phase, batch, m, n, k, itemsize, aligned)] += 1
            # CUDA's fast path is one grouped kernel (bf16); the fallback an mm per group
            bf16 = str(a.dtype) == str(b.dtype) == "torch.bfloat16"
            self.kernels[phase] += 1 if bf16 else batch
        elif name in CUDNN_RNN_OPS:
            for shape, calls in cudnn_rnn_gemms(name, args).items():
                self.gemms[(phase, *shape)] += calls
                self.kernels[phase] += calls
            steps, nbytes = cudnn_rnn_pointwise(name, args)
            self.memory_bytes[phase] += nbytes
            self.kernels[phase] += steps
        elif name in ATTENTION_KERNELS:
            # torch's flop formulas count the full L x S score matrix; a causal kernel skips the masked half
            # (the FlashAttention papers count causal FLOPs as half of the full ones)
            causal = _causal(func, args, kwargs)
            key = (phase, ATTENTION_KERNELS[name], _itemsize(args))
            self.attention[key] += flops / 2 if causal else flops
            shape = _attention_shape(name, args)
            if shape is not None:
                self.attention_shapes[(*key, *shape, causal)] += flops / 2 if causal else flops
            self.kernels[phase] += 1
        elif name in BATCH_NORM_FORWARD or name in BATCH_NORM_BACKWARD:
            impl, nbytes = batch_norm_traffic(name, args)
            self.batch_norms[(phase, impl)] += nbytes
            self.kernels[phase] += 1
        elif name in CONV_OPS or flops:
            if name in CONV_OPS and _depthwise(name, args):
                for key in _depthwise_kernels(name, phase, args, out):
                    self.depthwise[key] += 1
                    self.kernels[phase] += 1
            else:
                if name == "aten.convolution_backward":
                    flops = _conv_backward_flops(args, flops)
                self.convs[(phase, flops, *_conv_bytes(name, args, out))] += 1
                self.kernels[phase] += 1
            bias = _conv_bias(name, args, out)
            if bias:
                path, nbytes = bias
                self.memory_bytes[phase if path == "vectorized" else (phase, path)] += nbytes
                self.kernels[phase] += 1
        else:
            tensors = _tensors((args, kwargs)) + _tensors(out)
            path = _kernel_path(name, func, tensors, out)
            unread = _unread_bytes(name, args, out)
            nbytes = sum(_bytes(t) for t in tensors) - unread
            self.memory_bytes[phase if path == "vectorized" else (phase, path)] += nbytes
            launches = _foreach_launches(name, args)
            self.kernels[phase] += launches
            if fused and path != "foreach":  # the model's pointwise ops and reductions: fused
                self._fusion.fusible(phase, block_of(module), _tensors((args, kwargs)), _tensors(out), launches,
                                     unread)
                return
        # a kernel the compiler does not generate (GEMM, attention, convolution, a multi-tensor op) or any op of an
        # uncompiled phase ends the region; the memory-bound work of such ops (a convolution's bias, cuDNN's RNN
        # pointwise kernels, a foreach op) stays eager
        self._fusion.close()
        if fused:
            self.fused_bytes[phase] += sum(self.memory_bytes.values()) - memory_before

    def elsewhere(self, name: str, phase: str, args: tuple, out: Any) -> None:
        """An op these costs do not record (the middle block's costs, plan/tracing/repeat.py, are told of every op
        outside the block): it ends the fused region where it does in the step's costs (another phase, a kernel)."""
        if self._fusion is None:
            return
        self._fusion.at(phase)
        if _launches(name, args, out):
            self._fusion.close()

    def combine(self, other: OpCosts, weight: float) -> OpCosts:
        """self + weight x (other - self): linear extrapolation between two traces (values kept >= 0)."""
        out = OpCosts()
        for part in self.PARTS:
            a, b = getattr(self, part), getattr(other, part)
            getattr(out, part).update({k: max(a.get(k, 0) + weight * (b.get(k, 0) - a.get(k, 0)), 0)
                                       for k in _keys(a, b)})
        return out

    def compiled(self) -> OpCosts:
        """A copy as a fusing compiler runs the forward and backward (`--compile`, plan/speed/fusion.py): their
        memory-bound bytes are the fused kernels' (at the vectorised loop's bandwidth), their kernels the fused
        ones in place of the eager memory-bound ones, and the host launches those kernels instead of dispatching
        every aten op (Inductor's generated wrapper calls the kernels; no per-op dispatch)."""
        out = OpCosts()
        for part in self.PARTS:
            getattr(out, part).update(getattr(self, part))
        for phase in FUSED_PHASES:
            for key in [k for k in out.memory_bytes if _phase(k) == phase]:
                del out.memory_bytes[key]
            if self.fused_bytes.get(phase):
                out.memory_bytes[phase] = self.fused_bytes[phase]
            if phase in self.kernels:
                out.kernels[phase] = max(self.kernels[phase] - self.memory_kernels.get(phase, 0)
                                         + self.fused_kernels.get(phase, 0), 0)
                out.host_ops[phase] = out.kernels[phase]
        return out

    def relabel_attention(self, kernel: str, as_kernel: str, max_head_dim: int | None = None) -> OpCosts:
        """A copy whose `kernel` attention FLOPs are priced as `as_kernel` (same tensors, another kernel's speed).
        `max_head_dim`: only the calls of known head dim up to it (those of unknown shape stay `kernel`)."""
        out = OpCosts()
        for part in self.PARTS:
            getattr(out, part).update(getattr(self, part))
        out.attention, out.attention_shapes = Counter(), Counter()
        every = max_head_dim is None  # no bound: every `kernel` call moves, those of unknown shape too
        for (phase, k, *rest), flops in self.attention.items():
            out.attention[(phase, as_kernel if every and k == kernel else k, *rest)] += flops
        for (phase, k, itemsize, seq_q, seq_k, head_dim, causal), flops in self.attention_shapes.items():
            moved = k == kernel and (every or head_dim <= max_head_dim)
            if moved and not every and (phase, k, itemsize) in out.attention:
                out.attention[(phase, k, itemsize)] -= flops
                out.attention[(phase, as_kernel, itemsize)] += flops
            out.attention_shapes[(phase, as_kernel if moved else k, itemsize, seq_q, seq_k, head_dim, causal)] += flops
        for key in [key for key, flops in out.attention.items() if flops <= 0]:
            del out.attention[key]
        return out

    def added(self, other: OpCosts, sign: int = 1) -> OpCosts:
        """self + sign x other, key by key (exact: nothing clamped; a key of either is kept, also at 0)."""
        out = OpCosts()
        for part in self.PARTS:
            a, b = getattr(self, part), getattr(other, part)
            getattr(out, part).update({k: a.get(k, 0) + sign * b.get(k, 0) for k in _keys(a, b)})
        return out

    def phases(self, parts: tuple[str, ...] = PARTS) -> set[str]:
        """The phases with a nonzero count in `parts`."""
        return {_phase(k) for part in parts for k, v in getattr(self, part).items() if v}

    def scaled(self, factor: float, phases: tuple[str, ...] = ("forward", "backward")) -> OpCosts:
        """Counts of `phases` times `factor` (gradient accumulation: N micro-steps per optimizer step)."""
        out = OpCosts()
        for part in self.PARTS:
            getattr(out, part).update({k: v * factor if _phase(k) in phases else v
                                       for k, v in getattr(self, part).items()})
        return out


def _kernel_path(name: str, func, tensors: list, out) -> str:
    """Which of TensorIterator's loops runs a memory-bound op (aten/src/ATen/native/cuda/CUDALoops.cuh
    gpu_kernel_impl): "foreach" (multi_tensor_apply), "unrolled" (a pointwise op whose floating operands differ
    in dtype needs dynamic casting: launch_unrolled_kernel, no vector loads; the fp32 -> fp16/bf16 copy has its
    own vectorised kernel, Copy.cu bfloat16_copy_kernel_cuda), "strided" (a pointwise op over a non-contiguous
    or broadcast operand: the offset-calculator loop, elementwise_kernel), else "vectorized". Bandwidth of
    each: plan/speed/memory_bound.py."""
    import torch

    if name.startswith("aten._foreach_") or name.startswith("aten._fused_"):
        return "foreach"
    if name not in COPY_OPS and torch.Tag.pointwise not in getattr(func, "tags", ()):
        return "vectorized"
    big = [t for t in tensors if t.numel() > 1]
    floats = {t.dtype for t in big if t.is_floating_point()}
    if len(floats) > 1 and not (name in COPY_OPS and isinstance(out, torch.Tensor) and out.element_size() == 2
                                and {t.dtype for t in big} == {torch.float32, out.dtype}):
        return "unrolled"
    shape = out.shape if isinstance(out, torch.Tensor) else None
    if any(not t.is_contiguous() or (shape is not None and t.shape != shape) for t in big):
        return "strided"  # a broadcast operand (implicit or expanded) is as good as non-contiguous
    return "vectorized"


def _causal(func, args, kwargs) -> bool:
    if "is_causal" in kwargs:
        return bool(kwargs["is_causal"])
    names = [a.name for a in getattr(getattr(func, "_schema", None), "arguments", [])]
    if "is_causal" in names and names.index("is_causal") < len(args):
        return bool(args[names.index("is_causal")])
    return False


def _keys(a: dict, b: dict) -> list:
    """The keys of `a` then those only in `b`, in their order: sums over the result go in the same order in every
    run (a set of string keys iterates in an order that changes with the interpreter's hash seed, and float sums
    with it, in the last bit)."""
    return list(dict.fromkeys([*a, *b]))


def _phase(key) -> str:
    return key[0] if isinstance(key, tuple) else key


def _tensors(obj) -> list:
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []


def _launches(name: str, args, out) -> bool:
    """The op runs a kernel: not an allocation or host read, a view (`_is_view`), nor a metadata query
    (is_same_size, ...: no tensor out, not in place)."""
    if name in NO_KERNEL_OPS or name.startswith("prim.") or _is_view(name, out, args):
        return False
    return bool(_tensors(out)) or name.endswith("_")


def _unread_bytes(name: str, args, out) -> int:
    """Bytes of an INDEXED_OPERAND op's indexed operand its kernel does not read."""
    import torch

    pos = INDEXED_OPERAND.get(name)
    if pos is None or len(args) <= pos or not isinstance(args[pos], torch.Tensor):
        return 0
    src = args[pos]
    if name.startswith("aten.nll_loss") and name.endswith("_backward"):
        picked = 0
    elif name.startswith("aten.nll_loss"):
        picked = args[1].numel() if isinstance(args[1], torch.Tensor) else 0
    else:
        picked = sum(t.numel() for t in _tensors(out))
    return max(_bytes(src) - picked * src.element_size(), 0)


def _is_view(name: str, out, args) -> bool:
    """An op whose output shares an input's storage without a kernel (view, transpose, expand...).
    In-place ops (`aten.add_`) also return their input's storage, but run one."""
    import torch

    if not isinstance(out, torch.Tensor) or name.endswith("_"):
        return False
    return id(out.untyped_storage()) in {id(t.untyped_storage()) for t in _tensors(args)}


def _gemm_shape(name: str, args, out=None) -> tuple[int, int, int, int, int, bool]:
    """(batch, m, n, k, itemsize, aligned) of a GEMM call; aligned: A, B and the output all 16-byte aligned
    (plan/speed/gemm.py)."""
    if name in ("aten.addmm", "aten.baddbmm"):
        a, b = args[1], args[2]
    else:
        a, b = args[0], args[1]
    shape_a, shape_b = tuple(a.shape), tuple(b.shape)
    batch = shape_a[0] if len(shape_a) == 3 else 1
    m, k = shape_a[-2], shape_a[-1]
    n = shape_b[-1]
    aligned = all(_aligned(t) for t in (a, b, *_tensors(out)))
    return batch, int(m), int(n), int(k), a.element_size(), aligned


def _aligned(t, align_bytes: int = ALIGN_BYTES) -> bool:
    """cuBLAS's vectorised kernels need every stride but the unit one (the leading dimension, the batch
    stride) and the base pointer to be multiples of 16 bytes; dimensions of size 1 have no stride to speak of."""
    size = t.element_size()
    try:
        strides = [st for st, d in zip(t.stride(), t.shape) if d > 1 and st != 1]
        return all(st * size % align_bytes == 0 for st in strides) and t.storage_offset() * size % align_bytes == 0
    except Exception:  # noqa: BLE001 - tensors without strides (sparse, nested): assume the common case
        return True


def _attention_shape(name: str, args) -> tuple[int, int, int] | None:
    """(seq_q, seq_k, head_dim) of an SDPA kernel call from its (batch, heads, seq, head dim) query and key:
    forward (query, key, value, ...), backward (grad_out, query, key, ...); None for other layouts."""
    import torch

    k_at = 2 if name.endswith("_backward") else 1
    if not name.startswith("aten._scaled_dot_product_") or len(args) <= k_at:
        return None
    q, k = args[0], args[k_at]
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and q.dim() == 4 and k.dim() == 4):
        return None
    return int(q.shape[2]), int(k.shape[2]), int(q.shape[3])


def _itemsize(args) -> int:
    tensors = _tensors(args[:1])
    return tensors[0].element_size() if tensors else 2


def _conv_bytes(name: str, args, out) -> tuple[int, int, int]:
    """(bytes the convolution reads and writes, bytes of those that are channels-first activations, operand
    itemsize). Activations: the tensors with the input's batch dimension other than the weight
    (aten.convolution: input, weight, ...; aten.convolution_backward: grad_output, input, weight, ...)."""
    import torch

    tensors = _tensors(args) + _tensors(out)
    nbytes = sum(_bytes(t) for t in tensors)
    if not tensors:
        return nbytes, 0, 4
    weight_at = 2 if name == "aten.convolution_backward" else 1
    weight = args[weight_at] if len(args) > weight_at else None
    inp = args[weight_at - 1] if len(args) >= weight_at and isinstance(args[weight_at - 1], torch.Tensor) \
        else tensors[0]
    channels_first = inp.dim() >= 4 and inp.is_contiguous() and not (
        inp.is_contiguous(memory_format=torch.channels_last) if inp.dim() == 4 else
        inp.is_contiguous(memory_format=torch.channels_last_3d))
    acts = [t for t in tensors if t is not weight and t.dim() == inp.dim() and t.shape[0] == inp.shape[0]]
    return nbytes, sum(_bytes(t) for t in acts) if channels_first else 0, inp.element_size()


def _conv_backward_flops(args, counted: int) -> int:
    """FLOPs of aten.convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
    transposed, output_padding, groups, output_mask): each of grad_input and grad_weight costs the forward's
    FLOPs, 2 x (elements of the GEMM's output side) x weight[0].numel() (weight[0] holds C_in / groups x
    kernel taps). torch.utils.flop_counter's formula leaves `groups` out of grad_input: a depthwise 7x7
    convolution's backward counted C times its FLOPs (96 channels: 357.7 M instead of 7.4 M)."""
    try:
        grad_out, inp, weight = args[0], args[1], args[2]
        transposed, mask = bool(args[7]), args[10]
        forward = 2 * (inp.numel() if transposed else grad_out.numel()) * weight[0].numel()
        return int(forward * (bool(mask[0]) + bool(mask[1])))
    except (IndexError, TypeError, AttributeError):
        return counted


def _conv_bias(name: str, args, out) -> tuple[str, int] | None:
    """The bias kernel ATen runs inside a convolution op, beside cuDNN's (aten/src/ATen/native/Convolution.cpp;
    the trace sees only the op): forward `output.add_(reshape_bias(input.dim(), bias))`, a broadcast add (the
    "strided" loop: output read and written, bias read); backward with output_mask[2], `grad_output.sum({0, 2,
    3})` (grad_output read, grad_bias written). (path, bytes), None without a bias. torch's own NCHW depthwise
    kernel adds the bias itself: charged all the same (one output pass)."""
    import torch

    try:
        if name == "aten.convolution" and isinstance(args[2], torch.Tensor):
            return "strided", 2 * _bytes(out) + _bytes(args[2])
        if name == "aten.convolution_backward" and args[10][2] and isinstance(out[2], torch.Tensor):
            return "vectorized", _bytes(args[0]) + _bytes(out[2])
    except (IndexError, TypeError, AttributeError):
        pass
    return None


def _depthwise(name: str, args) -> bool:
    """A depthwise convolution: one input channel per group (weight [C_out, 1, *kernel]) over more than one
    input channel (groups = C_in), not transposed. aten.convolution(input, weight, bias, stride, padding,
    dilation, transposed, ...); aten.convolution_backward(grad_output, input, weight, bias_sizes, stride, padding,
    dilation, transposed, ...); aten.cudnn_convolution(input, weight, ...) has no transposed flag."""
    backward = name == "aten.convolution_backward"
    try:
        inp, weight = args[int(backward)], args[1 + int(backward)]
        transposed = bool(args[6 + backward]) if name != "aten.cudnn_convolution" else False
        return weight.dim() >= 3 and weight.shape[1] == 1 and inp.shape[1] > 1 and not transposed
    except (IndexError, TypeError, AttributeError):
        return False


def _depthwise_kernels(name: str, phase: str, args, out) -> list[tuple]:
    """The kernels of a depthwise convolution call, as OpCosts.depthwise keys: the forward, or the backward's
    data and weight gradients (separate kernels: cuDNN's dgrad2d_* and wgrad2d_*), each with the FLOPs of the
    forward, 2 x output elements x kernel taps, and the bytes of the tensors it reads and writes."""
    if name != "aten.convolution_backward":
        inp, weight = args[0], args[1]
        tensors = [inp, weight, *_tensors(out)]
        flops = 2 * _tensors(out)[0].numel() * weight[0].numel()
        return [(phase, "forward", flops, sum(_bytes(t) for t in tensors), inp.element_size())]
    grad_out, inp, weight, mask = args[0], args[1], args[2], args[10]
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    flops = 2 * grad_out.numel() * weight[0].numel()
    keys = []
    for i, (pass_, operand) in enumerate((("data", weight), ("weight", inp))):
        if mask[i] and i < len(outs) and outs[i] is not None:
            nbytes = sum(_bytes(t) for t in (grad_out, operand, outs[i]))
            keys.append((phase, pass_, flops, nbytes, grad_out.element_size()))
    return keys


def _foreach_launches(name: str, args) -> int:
    if not name.startswith("aten._foreach_") and not name.startswith("aten._fused_"):
        return 1
    lists = [a for a in args if isinstance(a, (list, tuple)) and a and hasattr(a[0], "shape")]
    if not lists:
        return 1
    depth = min(len(lists), len(FOREACH_MAX_TENSORS))
    return max(1, math.ceil(len(lists[0]) / FOREACH_MAX_TENSORS[depth - 1]))
