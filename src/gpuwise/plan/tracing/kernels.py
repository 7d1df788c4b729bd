"""Memory that kernels allocate internally, below the dispatcher, where a fake trace cannot see it.

Two registries of small pure functions, one entry per aten op, each citing where the bytes come from:

- `WORKSPACES[op](target, args, kwargs) -> Workspace`: scratch a kernel takes while it runs. `before_bytes`
  are live (and gone) before the op's outputs exist, `during_bytes` live alongside its outputs; the
  tracer allocates and frees them around the op.
- `OUTPUT_BYTES[op](target, args, kwargs) -> {output index: bytes}`: outputs whose real size differs from
  what the op's meta kernel says (e.g. a oneDNN workspace returned as a tensor, meta says 0 bytes).

cuDNN / cuBLAS workspaces that the CUDA caching allocator keeps across steps are not here: they are
overheads of the allocator model. The CPU entries describe oneDNN (mkldnn) kernels, which reorder
plain NCHW tensors into channel-blocked layouts (nChw8c on AVX2, nChw16c on AVX-512) and back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Workspace:
    before_bytes: int = 0  # scratch freed before the op's outputs are allocated
    during_bytes: int = 0  # scratch alive together with the outputs, freed when the op returns


NONE = Workspace()
WORKSPACES: dict[str, Callable[[str, tuple, dict], Workspace]] = {}
OUTPUT_BYTES: dict[str, Callable[[str, tuple, dict], dict[int, int]]] = {}
PAGE_BYTES = 4096  # oneDNN aligns workspace parts to pages (src/cpu/rnn/rnn_utils.cpp `set_offsets`)


def _key(op: str) -> str:
    return op.replace("::", ".")


def register_workspace(op: str):
    """Register `fn(target, args, kwargs) -> Workspace` for `op` ("aten::name" or "aten.name")."""
    def deco(fn):
        WORKSPACES[_key(op)] = fn
        return fn
    return deco


def register_output_bytes(op: str):
    """Register `fn(target, args, kwargs) -> {output index: bytes}` for `op`."""
    def deco(fn):
        OUTPUT_BYTES[_key(op)] = fn
        return fn
    return deco


def workspace(op: str, target: str, args: tuple, kwargs: dict) -> Workspace:
    """Scratch the kernel of `op` takes for these arguments (NONE when none is known)."""
    fn = WORKSPACES.get(op)
    return fn(target, args, kwargs) if fn is not None else NONE


def output_bytes(op: str, target: str, args: tuple, kwargs: dict) -> dict[int, int]:
    fn = OUTPUT_BYTES.get(op)
    return fn(target, args, kwargs) if fn is not None else {}


# Backward formulas that, while any Python dispatch mode is on (as this tracer's), write into a fresh
# zeros tensor out-of-place instead of in place: torch/csrc/autograd/FunctionsManual.cpp branches on
# `areAnyTensorSubclassLike` (true under a mode) in index_backward (`index_put` vs `_index_put_impl_`),
# gather_backward (`scatter_add` vs `scatter_add_`) and index_add's backward. In a plain process the
# result *is* the zeros tensor; the tracer counts it so (op -> index of the zeros argument).
INPLACE_WITHOUT_MODE: dict[str, int] = {"aten.index_put": 0, "aten.scatter_add": 0, "aten.index_add": 0}
FRESH_ZEROS_OPS = ("aten.new_zeros", "aten.zeros_like", "aten.zeros")


def workspace_bytes(op: str, target: str, args: tuple, kwargs: dict) -> int:
    """The most scratch bytes `op` holds at once (for callers that want one number)."""
    ws = workspace(op, target, args, kwargs)
    return max(ws.before_bytes, ws.during_bytes)


@lru_cache(maxsize=1)
def onednn_block() -> int:
    """oneDNN's channel block: 16 floats on AVX-512 machines, else 8 (AVX2)."""
    import torch

    return 16 if "AVX512" in torch.backends.cpu.get_cpu_capability() else 8


def _rnd(x: int, m: int) -> int:
    return -(-x // m) * m


def _onednn_conv(target: str, x, w) -> bool:
    import torch

    return (target == "cpu" and x.dim() == 4 and x.dtype in (torch.float32, torch.bfloat16)
            and torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled)


def _blocked(n: int, c: int, spatial: int, elt: int) -> int:
    return n * _rnd(c, onednn_block()) * spatial * elt


# aten::convolution on CPU -> mkldnn_convolution (aten/src/ATen/native/mkldnn/Conv.cpp): the input
# (when it has at least one full block of channels) and the weight are reordered into blocked layouts,
# the result is computed blocked, then reordered into the plain output. Measured with the profiler
# on ResNet / LeNet layers: in_b + w_b + out_b live before the output, out_b alongside it.
@register_workspace("aten::convolution")
def _conv_forward(target, args, kwargs) -> Workspace:
    x, w = args[0], args[1]
    groups = args[8] if len(args) > 8 else kwargs.get("groups", 1)
    transposed = args[6] if len(args) > 6 else kwargs.get("transposed", False)
    if not _onednn_conv(target, x, w) or groups != 1 or transposed:
        return NONE
    elt, b = x.element_size(), onednn_block()
    n, c_in, h, wd = x.shape
    c_out = w.shape[0]
    k = w.shape[2] * w.shape[3]
    ho_wo = _out_spatial(x, w, args)
    in_b = _blocked(n, c_in, h * wd, elt) if c_in >= b else 0
    w_b = _rnd(c_out, b) * (_rnd(c_in, b) if c_in >= b else c_in) * k * elt
    out_b = _blocked(n, c_out, ho_wo, elt)
    return Workspace(before_bytes=in_b + w_b + out_b, during_bytes=out_b)


def _out_spatial(x, w, args) -> int:
    stride, padding, dilation = (list(a) if a is not None else [1, 1] for a in (args[3], args[4], args[5]))
    dims = []
    for i in range(2):
        size = x.shape[2 + i] + 2 * padding[i] - dilation[i] * (w.shape[2 + i] - 1) - 1
        dims.append(size // stride[i] + 1)
    return dims[0] * dims[1]


# aten::convolution_backward on CPU -> mkldnn_convolution_backward: grad_input is computed from
# blocked grad_output and weight (gO_b + w_b + gI_b, then gI_b is reordered into gI), then
# grad_weight from blocked grad_output and input (gI + gO_b + in_b + gW_b; gW_b alongside gW).
# Measured: a 3-channel (RGB) first layer's input is read in place (weight unpadded), others reordered.
@register_workspace("aten::convolution_backward")
def _conv_backward(target, args, kwargs) -> Workspace:
    grad_out, x, w = args[0], args[1], args[2]
    groups = args[9] if len(args) > 9 else kwargs.get("groups", 1)
    transposed = args[7] if len(args) > 7 else kwargs.get("transposed", False)
    mask = args[10] if len(args) > 10 else kwargs.get("output_mask", [True, True, True])
    if not _onednn_conv(target, x, w) or groups != 1 or transposed:
        return NONE
    elt = x.element_size()
    n, c_in, h, wd = x.shape
    c_out = w.shape[0]
    k = w.shape[2] * w.shape[3]
    go_b = _blocked(n, c_out, grad_out.shape[2] * grad_out.shape[3], elt)
    rgb = c_in == 3  # measured: a 3-channel first layer is read in place and its weight left unpadded
    w_b = _rnd(c_out, onednn_block()) * (c_in if rgb else _rnd(c_in, onednn_block())) * k * elt
    gi = x.numel() * elt
    gi_b = _blocked(n, c_in, h * wd, elt)
    in_b = 0 if rgb else gi_b
    # a non-contiguous grad_output (e.g. behind a flatten/transpose, as in ViT's patch embedding) is
    # first copied contiguous (Conv.cpp `grad_output.contiguous()`); the copy lives through the op
    copy = 0 if grad_out.is_contiguous() else grad_out.numel() * elt
    phases = []
    if mask[0]:
        phases.append(go_b + w_b + gi_b)
    if mask[1]:
        phases.append((gi if mask[0] else 0) + go_b + in_b + w_b)
    return Workspace(before_bytes=copy + max(phases, default=0), during_bytes=copy + (w_b if mask[1] else 0))


# aten::mkldnn_rnn_layer (aten/src/ATen/native/mkldnn/RNN.cpp) returns oneDNN's training workspace
# as its 4th output; the meta kernel says 0 bytes. Layout from oneDNN src/cpu/rnn/rnn_utils.cpp
# (`set_offsets`: page-aligned gates, states, c-states and diff states). Fitted against the real
# sizes: exact on 8 of 12 measured LSTM shapes, within 7% on the others.
@register_output_bytes("aten::mkldnn_rnn_layer")
def _rnn_workspace(target, args, kwargs) -> dict[int, int]:
    if target != "cpu":
        return {}
    x = args[0]
    mode, hidden = args[9], args[10]
    batch_first = args[14]
    steps, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    features = x.shape[-1]
    gates = {0: 1, 1: 1, 2: 4, 3: 3}.get(mode, 4)  # RNN_RELU, RNN_TANH, LSTM, GRU
    f32 = 4
    ld = gates * hidden
    if ld * f32 % 256 == 0:  # oneDNN get_good_ld: avoid 4K aliasing
        ld += 64 // f32
    parts_gates = steps * batch * ld * f32
    states = 2 * (steps + 1) * batch * max(features, hidden) * f32
    c_states = 2 * (steps + 1) * batch * hidden * f32 if mode == 2 else 0
    offset = 0
    for part in (parts_gates, states, c_states, states, states, c_states):
        offset = _rnd(offset, PAGE_BYTES) + part
    return {3: _rnd(offset, PAGE_BYTES) + PAGE_BYTES}


def _good_ld(dim: int) -> int:
    """oneDNN rnn_utils `get_good_ld`: round to 16 floats, add 16 when a multiple of 256 (4K aliasing)."""
    ld = _rnd(dim, 16)
    return ld + 16 if ld % 256 == 0 else ld


# While mkldnn_rnn_layer (and its backward) run, oneDNN holds the weights reordered into its ldigo
# layout (leading dimension gates*hidden padded by `get_good_ld`), the summed bias, and a scratchpad
# that grows with steps x batch x gates x hidden. Measured with the profiler on LSTM shapes (T, N, I, H):
# scratchpad = T*N*4H floats + 12-17 KiB; 16 KiB is used for the constant.
def _rnn_scratch(target, args, kwargs) -> Workspace:
    if target != "cpu":
        return NONE
    x = args[0]
    is_backward = len(args) > 16  # schemas: native_functions.yaml mkldnn_rnn_layer(_backward)
    mode, hidden = (args[14], args[15]) if is_backward else (args[9], args[10])
    batch_first = args[21] if is_backward else args[14]
    gates = {0: 1, 1: 1, 2: 4, 3: 3}.get(mode, 4)
    steps, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    f32 = 4
    weights = _good_ld(gates * hidden) * (x.shape[-1] + hidden) * f32
    scratch = steps * batch * gates * hidden * f32 + 16 * 1024
    return Workspace(during_bytes=weights + gates * hidden * f32 + scratch)


register_workspace("aten::mkldnn_rnn_layer")(_rnn_scratch)
register_workspace("aten::mkldnn_rnn_layer_backward")(_rnn_scratch)


# CPU TensorIterator promotes inputs of another dtype than the op's common dtype by copying them
# (aten/src/ATen/TensorIterator.cpp `compute_types`: "Promotes inputs by creating temporaries of the
# correct dtype", only when the common device is the CPU; CUDA casts inside the kernel). E.g. a bool
# mask times a float gradient (scatter_reduce's amax/amin backward) copies the mask to float for the
# op's duration. Pointwise ops (`torch.Tag.pointwise`) are TensorIterator ops; `where`'s condition is
# not part of the common dtype. 0-dim inputs (CPU scalars) are left out: bytes, not megabytes.
_NOT_PROMOTED_ARGS = {"aten.where": (0,), "aten.masked_fill": (1,), "aten.masked_fill_": (1,)}
_CATEGORY = {"bool": 0, "int": 1, "float": 2, "complex": 3}


def _category(dtype) -> int:
    if dtype.is_complex:
        return 3
    if dtype.is_floating_point:
        return 2
    return 0 if str(dtype) == "torch.bool" else 1


def promotion_copies_bytes(func, name: str, target: str, args: tuple) -> int:
    """Bytes of the temporary dtype copies CPU TensorIterator makes of `func`'s inputs."""
    import torch

    if target != "cpu" or torch.Tag.pointwise not in getattr(func, "tags", ()):
        return 0
    skip = _NOT_PROMOTED_ARGS.get(name, ())
    tensors = [a for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i not in skip]
    if len(tensors) < 2:
        return 0
    dims = [t for t in tensors if t.dim() > 0]
    if not dims or all(t.dtype == dims[0].dtype for t in tensors):
        return 0
    common = dims[0].dtype
    for t in dims[1:]:
        common = torch.promote_types(common, t.dtype)
    for t in tensors:  # a 0-dim tensor of a higher category still moves the common dtype up
        if t.dim() == 0 and _category(t.dtype) > _category(common):
            common = torch.promote_types(common, t.dtype)
    itemsize = torch.empty((), dtype=common).element_size()
    return sum(t.numel() * itemsize for t in dims if t.dtype != common)


# cuDNN RNN (aten._cudnn_rnn, routed there for the cuda target by plan/tracing/cudnn_rnn.py).
# Reserve space (output 3, kept by autograd for the backward; the meta kernel says 0 bytes): cuDNN does not
# document its layout (cudnnGetRNNTempSpaceSizes only returns the size). What the backward of the standard
# algorithm must read, per layer, direction, timestep and sample, in hidden-wide vectors of the input's dtype:
# - LSTM: the four gate activations (i, f, g, o), the cell state c_t and the hidden state h_t: 6;
# - GRU: the input projections (3) and recurrent projections (3) kept apart, because the candidate is
#   n = tanh(W_in x + b_in + r * (W_hn h + b_hn)) and dr needs the recurrent part alone, the three gate
#   activations (r, z, n) and h_t: 10;
# - RNN_RELU / RNN_TANH: the activation and h_t: 2.
# LSTM's 6 is what the records' per-sample slope gives (6.0 between batch 64 and 256); GRU's 10 was read off
# its records (10.0-10.4 per sample at batch 16-256, fp32 and float16) and then matched to the composition above.
# Checked against benchmarks/truth/nvidia-h200.jsonl (H200, torch 2.11.0+cu130, cuDNN 9): the LSTM LM
# (2 x 1024, 64 steps) and the bidirectional GRU (2 x 512, 256 steps) at batch 64 and 256, sgd / momentum /
# adamw, fp32 and bf16 autocast (which runs cuDNN in float16): all 24 rows within -2.2 .. +1.3 % peak allocated.
RESERVE_UNITS = {0: 2, 1: 2, 2: 6, 3: 10}


def _rnn_dims(x, batch_first: bool) -> tuple[int, int]:
    return (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])


def cudnn_rnn_reserve_bytes(x, mode: int, hidden: int, num_layers: int, bidirectional: bool, batch_first: bool,
                            train: bool) -> int:
    """The reserve space of a training-mode cuDNN RNN call on a padded (T, N, ...) input: `RESERVE_UNITS[mode]`
    hidden-wide vectors per layer, direction, step and sample, in the input's dtype (0 when not training)."""
    if not train:
        return 0
    steps, batch = _rnn_dims(x, batch_first)
    units = RESERVE_UNITS.get(int(mode), 6)
    return int(num_layers * (2 if bidirectional else 1) * steps * batch * units * hidden * x.element_size())


@register_output_bytes("aten::_cudnn_rnn")
def _cudnn_rnn_reserve(target, args, kwargs) -> dict[int, int]:
    if target != "cuda":
        return {}
    x, mode, hidden, num_layers, batch_first, train, bidirectional, batch_sizes = (
        args[0], args[6], args[7], args[9], args[10], args[12], args[13], args[14])
    if len(batch_sizes):
        return {}
    return {3: cudnn_rnn_reserve_bytes(x, mode, hidden, num_layers, bidirectional, batch_first, train)}


# RNN.cpp `_cudnn_rnn`: with batch_first the input is transposed to (T, N, I) and made contiguous (a copy,
# alive through the call); `_cudnn_rnn_backward_input` / `_weight` copy the input again and the output
# gradient (`grad_output.contiguous()` of the transposed view).
@register_workspace("aten::_cudnn_rnn")
def _cudnn_rnn_forward_ws(target, args, kwargs) -> Workspace:
    if target != "cuda" or len(args[14]) or not args[10]:
        return NONE
    x = args[0]
    return Workspace(during_bytes=x.numel() * x.element_size())


@register_workspace("aten::_cudnn_rnn_backward")
def _cudnn_rnn_backward_ws(target, args, kwargs) -> Workspace:
    if target != "cuda" or len(args[18]) or not args[14]:
        return NONE
    x, grad_out = args[0], args[7]
    dy = grad_out.numel() * grad_out.element_size() if grad_out is not None else 0
    return Workspace(during_bytes=x.numel() * x.element_size() + dy)
