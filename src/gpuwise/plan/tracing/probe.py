"""Measure what a CPU kernel allocates internally by running it once, for real, on zeros.

oneDNN's internal layouts and scratchpads depend on the CPU (AVX2 / AVX-512), the thread count and
the library version, so for the CPU target the exact numbers come from the machine itself: the op is
run once per distinct signature (shapes, strides, dtypes, other arguments) on real zero tensors under
the profiler (`profile_memory=True` reports every CPU-allocator call), and the trace uses what it
saw: the highest bytes the kernel held beyond its outputs, and its outputs' real sizes (e.g. a oneDNN
RNN workspace whose meta kernel says 0 bytes). Results are cached per signature for the process.

A convolution whose probe would be slow (no fast kernel for its dtype on this CPU) or whose inputs would
take more than `PROBE_MAX_BYTES` is probed at smaller spatial sizes and extrapolated, with a check
(plan/tracing/probe_scale.py). Other ops over `PROBE_MAX_BYTES` are not probed; the formulas of plan/tracing/kernels.py
stand in for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...profiling import cpu_memory_profile
from .kernels import Workspace
from .probe_scale import scaled_probe

# mkldnn_rnn_layer_backward takes the forward's oneDNN workspace, which a fake trace cannot fill in:
# its probe runs the forward for real first (`_measure_rnn_backward`).
PROBED_OPS = ("aten.convolution", "aten.convolution_backward", "aten.mkldnn_rnn_layer",
              "aten.mkldnn_rnn_layer_backward")
_RNN_SCRATCH: dict[tuple, Workspace] = {}
# Matrix products in bf16 / fp16 run through oneDNN on the CPU, and what they allocate inside depends on
# the ISA oneDNN picks: on AVX-512 BF16/FP16 and AMX its brgemm kernels take a scratchpad (measured here on
# a GPT-2 step: 50-174 KB per addmm, none on the AVX2 path under ONEDNN_MAX_CPU_ISA=AVX2), so they are
# probed on this machine like convolutions. fp32 products (MKL/BLAS) allocate nothing and are not probed.
MATMUL_OPS = ("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm")


def probed(name: str, args) -> bool:
    """Whether the CPU target runs this op for real once (see PROBED_OPS and MATMUL_OPS)."""
    if name in PROBED_OPS:
        return True
    if name not in MATMUL_OPS:
        return False
    import torch

    return any(isinstance(a, torch.Tensor) and a.dtype in (torch.bfloat16, torch.float16) for a in args)


def _rnn_key(x, hidden: int, mode: int) -> tuple:
    return (tuple(x.shape), x.dtype, hidden, mode)
PROBE_MAX_BYTES = 256 * 2**20  # real memory one probe may take for its inputs


@dataclass(frozen=True)
class Probe:
    workspace: Workspace
    output_bytes: dict[int, int]


_CACHE: dict[tuple, Probe | None] = {}


def _signature(name: str, args, kwargs) -> tuple | None:
    import torch

    def sig(a):
        if isinstance(a, torch.Tensor):
            return ("T", tuple(a.shape), tuple(a.stride()), a.dtype, a.storage_offset())
        if isinstance(a, (list, tuple)):
            return tuple(sig(x) for x in a)
        return a

    try:
        key = (name, sig(args), tuple(sorted((k, sig(v)) for k, v in kwargs.items())))
        hash(key)
    except TypeError:
        return None
    return key


def _input_bytes(args) -> int:
    import torch

    total = 0
    for a in args:
        if isinstance(a, torch.Tensor):
            total += a.untyped_storage().nbytes()
        elif isinstance(a, (list, tuple)):
            total += _input_bytes(a)
    return total


def probe(func, name: str, args, kwargs) -> Probe | None:
    """What `func(*args, **kwargs)` really allocates on this CPU (None when it cannot be probed)."""
    if name == "aten.mkldnn_rnn_layer_backward":
        key = _signature(name, args[:22], {})
        if key is None:
            return None
        if key not in _CACHE:
            _CACHE[key] = _measure_rnn_backward(func, args) if _input_bytes(args[:22]) <= PROBE_MAX_BYTES else None
        if _CACHE[key] is not None:
            return _CACHE[key]
        return _rnn_backward_formula(args)
    key = _signature(name, args, kwargs)
    if key is None:
        return None
    if key not in _CACHE:
        too_big = _input_bytes(args) > PROBE_MAX_BYTES
        raw, _how = scaled_probe(func, name, args, kwargs, _measure_raw, too_big)
        _CACHE[key] = None if raw is None else _probe_from(*raw)
    result = _CACHE[key]
    if name == "aten.mkldnn_rnn_layer" and result is not None:  # (input, ..., mode at 9, hidden at 10)
        _RNN_SCRATCH[_rnn_key(args[0], args[10], args[9])] = Workspace(during_bytes=result.workspace.during_bytes)
    return result


def _rnn_backward_formula(args) -> Probe | None:
    """The backward's scratch from its forward's probe, when the backward itself could not be probed."""
    scratch = _RNN_SCRATCH.get(_rnn_key(args[0], args[15], args[14]))
    if scratch is None:
        return None
    # measured with the profiler on LSTM shapes: the backward also copies the output gradient
    # (steps x batch x hidden) and two state gradients (batch x hidden) into oneDNN's layout
    x, hidden, batch_first = args[0], args[15], args[21]
    steps, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    copies = (steps + 2) * batch * hidden * x.element_size()
    return Probe(Workspace(during_bytes=scratch.during_bytes + copies), {})


def _measure_rnn_backward(func, args) -> Probe | None:
    """mkldnn_rnn_layer_backward reads the forward's oneDNN workspace, which a fake trace cannot fill in
    (an empty one corrupts memory): run the forward for real on zeros first, for a valid workspace, and
    profile the backward on it. Schemas: native_functions.yaml mkldnn_rnn_layer(_backward)."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.utils._python_dispatch import _disable_current_modes

    try:
        with _disable_current_modes(), unset_fake_temporarily(), torch.enable_grad():
            (x, w1, w2, w3, w4, hx, cx, _out, _hy, _cy, g_out, g_hy, g_cy, reverse, mode, hidden, layers, biases,
             train, bidirectional, batch_sizes, batch_first, _ws) = args
            x, w1, w2, w3, w4, hx, cx = (_real(t) for t in (x, w1, w2, w3, w4, hx, cx))
            out, hy, cy, ws = torch.ops.aten.mkldnn_rnn_layer(x, w1, w2, w3, w4, hx, cx, reverse, batch_sizes, mode,
                                                              hidden, layers, biases, bidirectional, batch_first,
                                                              True)
            grads = [None if g is None else _real(g) for g in (g_out, g_hy, g_cy)]
            real_args = (x, w1, w2, w3, w4, hx, cx, out, hy, cy, *grads, reverse, mode, hidden, layers, biases, train,
                         bidirectional, batch_sizes, batch_first, ws)
            with cpu_memory_profile() as prof:
                res = func(*real_args)
            sizes = {i: t.untyped_storage().nbytes() for i, t in enumerate(res) if isinstance(t, torch.Tensor)}
            allocs = _allocations(prof)
            del res, real_args, out, hy, cy, ws
    except Exception:  # noqa: BLE001 - the formula stands in
        return None
    return _probe_from(allocs, sizes)


def _real(a):
    import torch

    if isinstance(a, torch.Tensor):
        base = torch.zeros(a.untyped_storage().nbytes() // a.element_size() or 1, dtype=a.dtype)
        return base.as_strided(tuple(a.shape), tuple(a.stride()), a.storage_offset())
    if isinstance(a, (list, tuple)):
        return type(a)(_real(x) for x in a)
    return a


def _measure(func, args, kwargs) -> Probe | None:
    raw = _measure_raw(func, args, kwargs)
    return None if raw is None else _probe_from(*raw)


def _measure_raw(func, args, kwargs) -> tuple[list[int], dict[int, int]] | None:
    """The op's allocator calls in order (frees negative) and its outputs' sizes, run on real zeros."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    try:
        with _disable_current_modes():  # grad mode as the caller's: mkldnn_rnn_layer skips its workspace without it
            from torch._subclasses.fake_tensor import unset_fake_temporarily

            with unset_fake_temporarily():
                real_args, real_kwargs = _real(args), {k: _real(v) for k, v in kwargs.items()}
                with cpu_memory_profile() as prof:
                    out = func(*real_args, **real_kwargs)
                outs = out if isinstance(out, (tuple, list)) else (out,)
                sizes = {i: t.untyped_storage().nbytes() for i, t in enumerate(outs) if isinstance(t, torch.Tensor)}
                allocs = _allocations(prof)
                del out, outs, real_args, real_kwargs
    except Exception:  # noqa: BLE001 - a probe that fails leaves the formulas in charge
        return None
    return allocs, sizes


def _probe_from(allocs: list[int], sizes: dict[int, int]) -> Probe:
    """The op's scratch from its allocations in order (frees are negative) and its outputs' sizes: the
    peak live bytes, and that peak less the outputs (what is live only while the op runs)."""
    live = peak = 0
    for size in allocs:
        live += size
        peak = max(peak, live)
    out_bytes = sum(sizes.values())
    return Probe(Workspace(before_bytes=peak, during_bytes=max(peak - out_bytes, 0)), sizes)


def _allocations(prof) -> list[int]:
    events = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        size = getattr(node.extra_fields, "alloc_size", None)
        if size is not None and str(getattr(node.extra_fields, "device", "cpu")).startswith("cpu"):
            events.append((node.start_time_ns, size))
        stack.extend(node.children)
    return [s for _, s in sorted(events)]
