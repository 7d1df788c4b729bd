"""nn.LSTM / nn.GRU / nn.RNN as a GPU runs them: cuDNN's RNN, for tracing on CPU tensors standing for CUDA ones.

On CUDA, `_VF.lstm` / `gru` / `rnn_tanh` / `rnn_relu` (what torch.nn.modules.rnn calls) run `_cudnn_impl`
(aten/src/ATen/native/cudnn/RNN.cpp) whenever `cudnn_is_acceptable(input)` holds (cuDNN enabled, a
non-empty CUDA input; aten/src/ATen/native/TensorProperties.cpp): ONE `aten._cudnn_rnn` call over all
layers, directions and timesteps, and ONE `aten._cudnn_rnn_backward`. On CPU tensors the same module runs
oneDNN's per-layer kernel (LSTM) or a per-timestep decomposition into linear / sigmoid / tanh (GRU, RNN),
whose tensors and kernel count differ. So, for the cuda target, the `_VF` functions are replaced by
`_cudnn_rnn` with the arguments `_cudnn_impl` gives it:

- the weights: on the GPU the module's parameters are views of one flat buffer (`flatten_parameters`), and
  `try_get_weight_buf` hands that storage over as `weight_buf` (no copy); here the first weight stands for
  it (the same storage: nothing new is allocated);
- under autocast, `_cudnn_rnn_cast_reflatten` (aten/src/ATen/cudnn/AutocastRNN.cpp) casts the input and
  states to float16 (hard-coded kHalf, also under bfloat16 autocast) and copies the weights into a new
  float16 flat buffer, autograd-exposed; the same is done here;
- the reserve space (output 3; the meta kernel says 0 bytes, torch/_meta_registrations.py "TODO: Query
  cudnnGetRNNTrainingReserveSize") and the workspaces: plan/tracing/kernels.py `_cudnn_rnn_reserve`.

Packed sequences (`_VF.lstm(data, batch_sizes, ...)`) and the CPU target keep torch's own path.
`_cudnn_rnn_backward` has no meta kernel in torch: one is registered here (its outputs are the forward's
input, states and weights shaped; RNN.cpp `_cudnn_rnn_backward_input` / `_weight`).
"""

from __future__ import annotations

import contextlib
import functools

# cudnnRNNMode_t (cudnn_ops.h / cudnn_adv.h): the `mode` argument of aten._cudnn_rnn
MODES = {"rnn_relu": 0, "rnn_tanh": 1, "lstm": 2, "gru": 3}
GATES = {0: 1, 1: 1, 2: 4, 3: 3}


def cudnn_would_run(input) -> bool:
    """RNN.cpp `use_cudnn` -> TensorProperties.cpp `cudnn_is_acceptable`: cuDNN enabled by the user and a
    non-empty input (torch >= 2.3 dropped the float/double/half dtype check)."""
    import torch

    return bool(torch.backends.cudnn.enabled) and input.numel() > 0


@functools.lru_cache(maxsize=1)
def _register_backward_meta() -> None:
    import torch

    if torch._C._dispatch_has_kernel_for_dispatch_key("aten::_cudnn_rnn_backward", "Meta"):
        return
    lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - a Meta kernel torch lacks
    lib.impl("_cudnn_rnn_backward", _cudnn_rnn_backward_meta, "Meta")
    _LIBS.append(lib)


_LIBS: list = []


def _cudnn_rnn_backward_meta(input, weight, weight_stride0, weight_buf, hx, cx, output, grad_output, grad_hy,
                             grad_cy, mode, hidden_size, proj_size, num_layers, batch_first, dropout, train,
                             bidirectional, batch_sizes, dropout_state, reserve, output_mask):
    """RNN.cpp `_cudnn_rnn_backward`: dx like the input, dhx like hx, dcx like cx (LSTM), a gradient per weight."""
    import torch

    dx = torch.empty(input.shape, dtype=input.dtype, device=input.device)
    dhx = torch.empty(hx.shape, dtype=hx.dtype, device=hx.device)
    dcx = (torch.empty(cx.shape, dtype=cx.dtype, device=cx.device) if cx is not None
           else torch.empty(0, dtype=hx.dtype, device=hx.device))
    dw = [torch.empty(w.shape, dtype=w.dtype, device=w.device) for w in weight] if output_mask[3] else []
    return dx, dhx, dcx, dw


def _cudnn_impl(name: str, input, hx, cx, params, has_biases: bool, num_layers: int, dropout: float, train: bool,
                bidirectional: bool, batch_first: bool):
    """RNN.cpp `_cudnn_impl` (and, under autocast, AutocastRNN.cpp `_cudnn_rnn_cast_reflatten`)."""
    import torch

    mode = MODES[name]
    hidden_size, proj_size = hx.shape[2], 0
    if cx is not None and cx.shape[2] != hx.shape[2]:  # LSTM with projections
        hidden_size, proj_size = cx.shape[2], hx.shape[2]
    stride0 = (4 if has_biases else 2) + (1 if proj_size else 0)
    weights = list(params)
    autocast = torch.is_autocast_enabled("cpu")  # the CPU autocast state stands for CUDA's in this trace
    if autocast and weights[0].dtype != torch.float16:
        half = torch.float16  # kHalf, whatever the autocast dtype
        buf = torch.zeros(sum(w.numel() for w in weights), dtype=half, device=weights[0].device)
        # copy_weights_to_flat_buf_views: each weight copied (autograd-exposed) into its slice of the buffer;
        # the slices are tensors of their own on its storage (get_parameters), so the buffer needs no grad
        flat, views, offset = buf.detach(), [], 0
        for w in weights:
            view = flat[offset:offset + w.numel()].view(w.shape)
            view.copy_(w)
            views.append(view)
            offset += w.numel()
        weights, weight_buf = views, buf
        input, hx = input.to(half), hx.to(half)
        cx = cx.to(half) if cx is not None else None
    else:
        weight_buf = weights[0].detach()  # try_get_weight_buf: the flattened parameters' own storage
    _register_backward_meta()
    with torch.autocast("cpu", enabled=False):
        out = torch.ops.aten._cudnn_rnn(input, weights, stride0, weight_buf, hx, cx, mode, hidden_size, proj_size,
                                        num_layers, batch_first, float(dropout), bool(train), bool(bidirectional),
                                        [], None)
    return out[0], out[1], out[2]


def _is_packed(args) -> bool:
    import torch

    return isinstance(args[1], torch.Tensor) and args[1].dim() == 1  # (data, batch_sizes, hx, ...)


@contextlib.contextmanager
def rnn_as_gpu_runs_it():
    """Inside: `torch._VF.lstm` / `gru` / `rnn_tanh` / `rnn_relu` on padded (not packed) input run cuDNN's
    RNN op, as on a CUDA device (`_VF` is looked up at call time by torch.nn.modules.rnn, also when
    activation checkpointing recomputes the forward)."""
    import torch

    vf = torch._VF
    originals = {name: getattr(vf, name) for name in MODES}

    def route(name):
        original = originals[name]

        def run(*args, **kwargs):
            if kwargs or len(args) != 9 or _is_packed(args) or not cudnn_would_run(args[0]):
                return original(*args, **kwargs)
            input, hidden, params, has_biases, num_layers, dropout, train, bidirectional, batch_first = args
            if name == "lstm":
                hx, cx = hidden
                out, hy, cy = _cudnn_impl(name, input, hx, cx, params, has_biases, num_layers, dropout, train,
                                          bidirectional, batch_first)
                return out, hy, cy
            out, hy, _ = _cudnn_impl(name, input, hidden, None, params, has_biases, num_layers, dropout, train,
                                     bidirectional, batch_first)
            return out, hy
        return run

    for name in MODES:
        setattr(vf, name, route(name))
    try:
        yield
    finally:
        for name in MODES:
            if name in vf.__dict__:
                delattr(vf, name)
            if getattr(vf, name) is not originals[name]:
                setattr(vf, name, originals[name])
