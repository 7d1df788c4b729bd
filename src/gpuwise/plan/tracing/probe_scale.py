"""A convolution probe that would be slow (or too big) is measured at smaller spatial sizes and extrapolated.

A probe runs the op for real (plan/tracing/probe.py). Where the CPU has no fast kernel for the dtype (bf16
convolutions on an AVX2 machine fall back to ATen's im2col kernels: 13 s for one 64-channel 224 px
layer at batch 2), probing every convolution of a model at full size takes longer than the step
itself. The bytes those kernels allocate are sums of products of the sizes (im2col columns, outputs,
per-thread scratch): with every spatial size moved
in steps that keep the stride arithmetic exact and every block rounding (multiples of 16 output
positions, i.e. 16 x stride input positions), each allocator call's size is a polynomial in the step
count of degree at most the number of spatial dimensions. So the probe is run at `degree + 1` small
sizes (8, 9, ... output positions), every call's polynomial through them is evaluated at the real size
(Lagrange), and one size about twice as large checks the fit; when it does not hold, the full probe runs. Only at sizes where ATen picks the same
kernel as at the real size (`_select_conv_backend`), and only for ATen's own kernels (below).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

SCALED_OPS = ("aten.convolution", "aten.convolution_backward")
# ATen's own im2col / vol2col kernels (aten/src/ATen/native/ConvolutionMM2d.cpp, NaiveDilatedConvolution.cpp,
# ConvolutionMM3d.cpp, NaiveConvolutionTranspose2d/3d.cpp): their buffers are products of the sizes. oneDNN
# (Mkldnn) is left out: it changes its algorithm with the size inside the library, where a small probe
# cannot see it (a 512-channel conv1d backward at 3199 steps reorders 7 MB more than at 16..64 steps);
# it is also the fast path, where a full probe is cheap.
SCALABLE_BACKENDS = ("Slow2d", "Slow3d", "SlowDilated2d", "SlowDilated3d", "SlowTranspose2d", "SlowTranspose3d")
MIN_OUTPUT_POSITIONS = 8  # the smallest probed output size per spatial dimension
FIT_TOLERANCE = 1e-3       # relative miss of the check point that still counts as a fit


@dataclass(frozen=True)
class Geometry:
    spatial_in: tuple[int, ...]
    steps_in: tuple[int, ...]
    out_of: Callable[[tuple[int, ...]], tuple[int, ...]]


def _geometry(name: str, args) -> Geometry | None:
    """Spatial sizes of the input and how the output follows them, from aten's convolution schemas
    (native_functions.yaml: `convolution(input, weight, bias, stride, padding, dilation, transposed,
    output_padding, groups)`, `convolution_backward(grad_output, input, weight, bias_sizes, stride, ...)`)."""
    first = 1 if name == "aten.convolution_backward" else 0
    x, w = args[first], args[first + 1]
    stride, padding, dilation, transposed, out_pad = args[first + 3: first + 8]
    dims = x.dim() - 2
    if dims < 1 or len(args) < first + 9:
        return None
    k = tuple(w.shape[2:])

    def out_of(sizes):
        if transposed:
            return tuple((h - 1) * s - 2 * p + d * (kk - 1) + op + 1
                         for h, s, p, d, kk, op in zip(sizes, stride, padding, dilation, k, out_pad, strict=True))
        return tuple((h + 2 * p - d * (kk - 1) - 1) // s + 1
                     for h, s, p, d, kk in zip(sizes, stride, padding, dilation, k, strict=True))

    steps = tuple(1 if transposed else s for s in stride)  # one output position per step
    return Geometry(tuple(x.shape[2:]), steps, out_of)


def _like(t, shape, shape_only: bool = False):
    """Zeros of `shape` with `t`'s dtype and stride order (dense); None when `t` is not dense."""
    import torch

    order = sorted(range(t.dim()), key=lambda i: (-t.stride()[i], -i))
    expected = 1
    for i in reversed(order):
        if t.shape[i] != 1 and t.stride()[i] != expected:
            return None
        expected *= t.shape[i]
    make = torch.empty if shape_only else torch.zeros
    base = make([shape[i] for i in order], dtype=t.dtype)
    inverse = sorted(range(t.dim()), key=lambda i: order[i])
    return base.permute(inverse)


def _args_at(name: str, args, geo: Geometry, m: int, shape_only: bool = False):
    """The op's arguments with the spatial sizes `m` steps smaller (None when a tensor is not dense);
    `shape_only`: uninitialised, for asking which kernel ATen would pick (the meta device has its own)."""
    first = 1 if name == "aten.convolution_backward" else 0
    x = args[first]
    spatial = tuple(h - m * s for h, s in zip(geo.spatial_in, geo.steps_in, strict=True))
    new_x = _like(x, (*x.shape[:2], *spatial), shape_only)
    if new_x is None:
        return None
    out = list(args)
    out[first] = new_x
    if first:
        g = args[0]
        new_g = _like(g, (*g.shape[:2], *geo.out_of(spatial)), shape_only)
        if new_g is None:
            return None
        out[0] = new_g
    return tuple(out)


def _backend(name: str, args) -> str | None:
    """The kernel ATen picks for these arguments (`torch._C._select_conv_backend`, the choice
    Convolution.cpp makes: e.g. oneDNN only above a size, im2col below it and for bf16 on AVX2)."""
    import torch

    first = 1 if name == "aten.convolution_backward" else 0
    try:
        x, w = args[first], args[first + 1]
        bias = None if first else args[2]
        stride, padding, dilation, transposed, out_pad, groups = args[first + 3: first + 9]
        return str(torch._C._select_conv_backend(x, w, bias, list(stride), list(padding), list(dilation),
                                                  bool(transposed), list(out_pad), groups, None))
    except Exception:  # noqa: BLE001 - cannot tell: no scaling
        return None


def _sample_steps(name: str, args, geo: Geometry, degree: int) -> list[int]:
    """Step counts to probe at, smallest sizes first: `degree + 1` consecutive ones at the smallest output
    size allowed (cheap), then a check point about twice as large; all where ATen picks the same kernel
    as at full size. Empty when the op is not scaled (oneDNN, no room to shrink, another kernel)."""
    full = _backend(name, args)
    if full is None or full.rsplit(".", 1)[-1] not in SCALABLE_BACKENDS:
        return []

    def ok(m: int) -> bool:
        spatial = tuple(h - m * s for h, s in zip(geo.spatial_in, geo.steps_in, strict=True))
        return min(spatial) >= 1 and min(geo.out_of(spatial)) >= MIN_OUTPUT_POSITIONS

    if not ok(1):
        return []
    low, high = 1, max(geo.spatial_in)  # the largest m that is ok (ok is monotone in m)
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if ok(mid) else (low, mid - 1)
    chosen = [low - i for i in range(degree + 1)] + [low - degree - MIN_OUTPUT_POSITIONS]
    if chosen[-1] < 1:
        return []
    for m in chosen:
        small = _args_at(name, args, geo, m, shape_only=True)
        if small is None or _backend(name, small) != full:
            return []
    return chosen


def _lagrange_at_zero(points: list[tuple[int, int]]) -> int:
    total = 0.0
    for i, (mi, fi) in enumerate(points):
        weight = 1.0
        for j, (mj, _f) in enumerate(points):
            if j != i:
                weight *= (0 - mj) / (mi - mj)
        total += fi * weight
    return round(total)


Raw = tuple[list[int], dict[int, int]]  # allocator calls in order (frees negative), output sizes


def _extrapolate(samples: list[tuple[int, Raw]]) -> Raw | None:
    """Every allocator call and output size on its polynomial through the samples, at step 0 (the real
    size). Calls, not the peak: which phase of a kernel holds the most can change with the size, and the
    peak is a maximum over phases, not a polynomial. None when the samples differ in their calls."""
    allocs0, sizes0 = samples[0][1]
    if any(len(a) != len(allocs0) or set(o) != set(sizes0) for _m, (a, o) in samples):
        return None
    if any((x > 0) != (y > 0) for _m, (a, _o) in samples for x, y in zip(a, allocs0, strict=True)):
        return None
    allocs = [_lagrange_at_zero([(m, a[i]) for m, (a, _o) in samples]) for i in range(len(allocs0))]
    sizes = {k: max(_lagrange_at_zero([(m, o[k]) for m, (_a, o) in samples]), 0) for k in sizes0}
    return allocs, sizes


def _fits(samples: list[tuple[int, Raw]], check_m: int, check: Raw) -> bool:
    """The polynomials through `samples`, evaluated at `check_m`, give the measured `check`."""
    guess = _extrapolate([(m - check_m, raw) for m, raw in samples])
    if guess is None or len(guess[0]) != len(check[0]) or set(guess[1]) != set(check[1]):
        return False
    pairs = list(zip(guess[0], check[0], strict=True)) + [(guess[1][k], v) for k, v in check[1].items()]
    return all(abs(g - v) <= FIT_TOLERANCE * max(abs(v), 1) for g, v in pairs)


def scaled_probe(func, name: str, args, kwargs, measure_raw, too_big: bool) -> tuple[Raw | None, str]:
    """`measure_raw(func, args, kwargs)` extrapolated from smaller sizes where the op allows it (and the
    check holds), else at full size (or None when `too_big`). Returns (allocations and output sizes, or
    None; "scaled" | "full" | "none")."""
    def full():
        return (None, "none") if too_big else (measure_raw(func, args, kwargs), "full")

    geo = _geometry(name, args) if name in SCALED_OPS else None
    ms = _sample_steps(name, args, geo, len(geo.spatial_in)) if geo is not None else []
    if not ms:
        return full()
    samples: list[tuple[int, Raw]] = []
    for m in ms:
        small = _args_at(name, args, geo, m)
        raw = measure_raw(func, small, kwargs) if small is not None else None
        if raw is None:
            return full()
        samples.append((m, raw))
    if _fits(samples[:-1], ms[-1], samples[-1][1]):
        guess = _extrapolate(samples[:-1])
        if guess is not None:
            return guess, "scaled"
    return full()
