"""The aten ops that stand for several kernels, as the speed model prices them: cuDNN's RNN (`aten._cudnn_rnn` and
its backward: a GEMM per layer and step plus the gate kernels) and the mixture-of-experts grouped GEMM
(`aten._grouped_mm`: its groups as a batch of equal GEMMs). torch's flop counter has formulas for neither.
`OpCosts.record` (plan/speed/ops.py) and the tracer's FLOP count (plan/tracing/dispatch.py) read them here.
"""

from __future__ import annotations

import math


def _rnn_args(name: str, args) -> tuple:
    """(x, weights, stride0, mode, hidden, proj, layers, batch_first, bidirectional, packed) of aten._cudnn_rnn /
    _cudnn_rnn_backward (native_functions.yaml schemas)."""
    if name == "aten._cudnn_rnn":
        return (args[0], args[1], args[2], args[6], args[7], args[8], args[9], args[10], args[13], len(args[14]) > 0)
    return (args[0], args[1], args[2], args[10], args[11], args[12], args[13], args[14], args[17], len(args[18]) > 0)


def _rnn_dims(name: str, args) -> tuple[int, int, int, int, int, int, int, list[int]]:
    x, weights, stride0, mode, hidden, proj, layers, batch_first, bidirectional, packed = _rnn_args(name, args)
    gates = {0: 1, 1: 1, 2: 4, 3: 3}.get(int(mode), 4)
    dirs = 2 if bidirectional else 1
    if packed:  # (sum of batch sizes, features): priced as one sequence of that many steps of batch 1
        steps, batch = int(x.shape[0]), 1
    else:
        steps, batch = (int(x.shape[1]), int(x.shape[0])) if batch_first else (int(x.shape[0]), int(x.shape[1]))
    out = int(proj) or int(hidden)
    inputs = [int(x.shape[-1])] + [out * dirs] * (int(layers) - 1)
    return gates, dirs, steps, batch, int(hidden), out, x.element_size(), inputs


def cudnn_rnn_gemms(name: str, args) -> dict[tuple, int]:
    """{(batch, m, n, k, itemsize, aligned): calls} of one cuDNN RNN call, per layer and direction, as the
    standard algorithm runs it (cuDNN developer guide, "Features of RNN Functions": CUDNN_RNN_ALGO_STANDARD runs
    each layer as a sequence of operations; Appleyard, Kocisky & Blunsom, "Optimizing Performance of Recurrent
    Neural Networks on GPUs", arXiv:1604.01946, sections 3.1-3.2: the input projection of all timesteps is one
    GEMM per layer, the recurrent GEMM one per timestep):
    forward: x W_ih^T over all T x N rows once; h W_hh^T once per step (m = N: small and serial).
    backward (about twice the forward): dh W_hh once per step; dx = dgates W_ih, dW_ih = dgates^T x and
    dW_hh = dgates^T h once each, over all steps."""
    gates, dirs, steps, batch, hidden, out, itemsize, inputs = _rnn_dims(name, args)
    calls: dict[tuple, int] = {}

    def add(m, n, k, c):
        key = (1, m, n, k, itemsize, True)
        calls[key] = calls.get(key, 0) + c * dirs

    for features in inputs:
        if name == "aten._cudnn_rnn":
            add(steps * batch, gates * hidden, features, 1)
            add(batch, gates * hidden, out, steps)
        else:
            add(batch, out, gates * hidden, steps)
            add(steps * batch, features, gates * hidden, 1)
            add(gates * hidden, features, steps * batch, 1)
            add(gates * hidden, out, steps * batch, 1)
    return calls


def cudnn_rnn_pointwise(name: str, args) -> tuple[int, int]:
    """(kernels, bytes) of the per-step gate kernels: one per layer, direction and step, reading the two
    projected gate blocks and the previous states and writing the states and the kept gates (reserve space):
    (3 x gates + 3) hidden-wide vectors per sample; the backward the same again."""
    gates, dirs, steps, batch, hidden, out, itemsize, inputs = _rnn_dims(name, args)
    kernels = len(inputs) * dirs * steps
    return kernels, kernels * batch * hidden * (3 * gates + 3) * itemsize


def grouped_mm_operands(args, kwargs) -> tuple:
    """(mat_a, mat_b, offs, out_dtype) of `aten._grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None)`."""
    given = {**dict(zip(("mat_a", "mat_b", "offs", "bias", "out_dtype"), args)), **kwargs}
    return given["mat_a"], given["mat_b"], given.get("offs"), given.get("out_dtype")


def grouped_mm_gemm(args, kwargs) -> tuple[int, int, int, int, int]:
    """(batch, m, n, k, itemsize) standing for one `aten._grouped_mm` call (torch._grouped_mm: mixture-of-experts
    GEMMs, one group per expert): its groups as a batch of equal GEMMs. How the tokens split among the groups
    is data the trace does not have (the offsets); an even split is taken, which tiles each group as the
    grouped kernel does. Layouts (torch/_meta_registrations.py `_create_grouped_mm_output_tensor`): 2d x 3d
    (tokens S x K, G x K x N: the experts' forward), 2d x 2d (M x T, T x N, T split in G: weight gradients),
    3d x 3d (a batched mm), 3d x 2d (G x M x K, K x N split in G)."""
    a, b, offs, _ = grouped_mm_operands(args, kwargs)
    if a.dim() == 2 and b.dim() == 3:
        groups = b.shape[0]
        return int(groups), math.ceil(a.shape[0] / groups), int(b.shape[2]), int(a.shape[1]), a.element_size()
    if a.dim() == 2:
        groups = offs.shape[0]
        return int(groups), int(a.shape[0]), int(b.shape[1]), math.ceil(a.shape[1] / groups), a.element_size()
    if b.dim() == 3:
        return int(a.shape[0]), int(a.shape[1]), int(b.shape[2]), int(a.shape[2]), a.element_size()
    groups = a.shape[0]
    return int(groups), int(a.shape[1]), math.ceil(b.shape[1] / groups), int(a.shape[2]), a.element_size()


def grouped_mm_flops(args, kwargs) -> int:
    """FLOPs of one `aten._grouped_mm` call (torch's flop counter has no formula for it): 2 x the contraction
    length x the output elements, whatever the split (2d x 2d: 2 M N T)."""
    a, b, _, _ = grouped_mm_operands(args, kwargs)
    if a.dim() == 2 and b.dim() == 2:
        return 2 * a.shape[0] * a.shape[1] * b.shape[1]
    if a.dim() == 2:
        return 2 * a.shape[0] * a.shape[1] * b.shape[2]
    if b.dim() == 3:
        return 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
    return 2 * a.shape[1] * a.shape[2] * b.shape[1]


def cudnn_rnn_flops(name: str, args) -> int:
    """FLOPs of the GEMMs of `cudnn_rnn_gemms` (torch's flop counter has no formula for these ops)."""
    return sum(2 * b * m * n * k * c for (b, m, n, k, _, _), c in cudnn_rnn_gemms(name, args).items())
