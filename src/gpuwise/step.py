"""The training step gpuwise owns: optimizers, precision, activation checkpointing, one step.

Plan (fake-tensor tracing), measure (real device), tune, watch and train all run this same code, so a
prediction and a measurement describe the same step:

    move batch to device -> autocast if asked -> loss(model, batch).backward() -> optimizer.step()
    -> optimizer.zero_grad(set_to_none=True)
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import optional_libs  # by module: tests hide packages by patching optional_libs.available
from .errors import GpuwiseError
from .sac import selective_context_fn

# name -> (factory(params, **impl_kwargs), description). Learning rates are the usual defaults; they do
# not change memory or time. Source of the state sizes: torch/optim/*.py (`state[...] = torch.zeros_like`).
OPTIMIZERS: dict[str, tuple[Callable, str]] = {}


def register_optimizer(name: str, description: str):
    def deco(fn):
        OPTIMIZERS[name] = (fn, description)
        return fn
    return deco


@register_optimizer("sgd", "plain SGD: no state")
def _sgd(params, **kw):
    import torch
    return torch.optim.SGD(params, lr=1e-2, **kw)


@register_optimizer("momentum", "SGD with momentum 0.9: one buffer per parameter")
def _momentum(params, **kw):
    import torch
    return torch.optim.SGD(params, lr=1e-2, momentum=0.9, **kw)


@register_optimizer("adam", "Adam: exp_avg + exp_avg_sq per parameter (+ step)")
def _adam(params, **kw):
    import torch
    return torch.optim.Adam(params, lr=1e-3, **kw)


@register_optimizer("adamw", "AdamW (default): exp_avg + exp_avg_sq per parameter (+ step)")
def _adamw(params, **kw):
    import torch
    return torch.optim.AdamW(params, lr=1e-3, **kw)


@register_optimizer("adagrad", "Adagrad: sum per parameter (+ step)")
def _adagrad(params, **kw):
    import torch
    return torch.optim.Adagrad(params, lr=1e-2, **kw)


@register_optimizer("rmsprop", "RMSprop: square_avg per parameter (+ step)")
def _rmsprop(params, **kw):
    import torch
    return torch.optim.RMSprop(params, lr=1e-3, **kw)


@register_optimizer("adafactor", "transformers' Adafactor: factored second moment (a row and a column vector "
                    "per matrix), no first moment (beta1=None)")
def _adafactor(params, **kw):
    # transformers/optimization.py `Adafactor`: state exp_avg_sq_row / exp_avg_sq_col for >= 2-D parameters,
    # exp_avg_sq for vectors, plus `RMS` and `step`; the foreach/fused switches do not exist there.
    from transformers.optimization import Adafactor
    return Adafactor(params, lr=1e-3, scale_parameter=False, relative_step=False, warmup_init=False)


@register_optimizer("adamw8bit", "bitsandbytes' 8-bit AdamW: two uint8 states per parameter, fp32 absmax per "
                    "256-element block (32-bit states below 4096 elements)")
def _adamw8bit(params, **kw):
    # bitsandbytes/optim/optimizer.py `Optimizer2State.init_state`: state1/state2 uint8 (numel), qmap1/qmap2
    # (256 fp32), absmax1/absmax2 (ceil(numel / 256) fp32); parameters under `min_8bit_size` = 4096 keep
    # fp32 states. Its ops have fake kernels (bitsandbytes/_ops.py), so the trace runs the real optimizer.
    params = list(params)
    if not optional_libs.available("bitsandbytes"):
        if optional_libs.all_fake(params):  # a trace: the same state tensors, sized without the library
            return optional_libs.adamw8bit_layout(params, lr=1e-3)
        raise GpuwiseError("--optimizer adamw8bit needs bitsandbytes (pip install bitsandbytes)")
    bnb = optional_libs.imported("bitsandbytes")
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():  # the constructor builds its quantization maps with .tolist(): real data
        return bnb.optim.AdamW8bit(params, lr=1e-3)


_WARMED: set[str] = set()


def warm_optimizer(name: str) -> None:
    """Build optimizer `name` once on a real one-element parameter, outside any trace, once per process.
    bitsandbytes' first AdamW8bit makes two 64-byte tensors that later ones do not (seen in a trace's
    setup: `aten.lift_fresh`, two allocations in a process's first trace only), so a trace taken first in
    a process differed from the same trace taken later (the rebuild's 4-block check failed in a fresh
    process). Adafactor's module, transformers.optimization, imports peft and bitsandbytes, whose import
    makes module-level tensors (two 64-byte, two 8-byte): imported here, not inside a process's first
    Adafactor trace. Nothing to do for optimizers without such process-wide state, or when the library is absent."""
    if name in _WARMED:
        return
    if name == "adafactor":
        _WARMED.add(name)
        import transformers.optimization  # noqa: F401
        return
    if name != "adamw8bit" or not optional_libs.available("bitsandbytes"):
        return
    import torch

    _WARMED.add(name)
    _adamw8bit([torch.nn.Parameter(torch.zeros(1))])


OPTIMIZER_IMPLS = ("default", "for-loop", "foreach", "fused")


def make_optimizer(name: str, params, impl: str = "default"):
    """Build a registered optimizer. `impl` picks for-loop / foreach / fused; 'default' lets torch choose
    (foreach on CUDA, for-loop on CPU; see torch/optim/optimizer.py `_default_to_fused_or_foreach`)."""
    key = optimizer_name(name)
    if impl not in OPTIMIZER_IMPLS:
        raise GpuwiseError(f"unknown optimizer implementation {impl!r}; choose from: {', '.join(OPTIMIZER_IMPLS)}")
    kw = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}.get(impl, {})
    return OPTIMIZERS[key][0](params, **kw)


def optimizer_name(name: str) -> str:
    """The canonical registry name (validates)."""
    key = name.lower().replace("_", "").replace("-", "")
    key = {"sgdmomentum": "momentum", "sgdm": "momentum"}.get(key, key)
    if key not in OPTIMIZERS:
        raise GpuwiseError(f"unknown optimizer {name!r}; choose from: {', '.join(OPTIMIZERS)}")
    return key


# precision -> what it means. "bf16-pure" casts the model and float inputs to bfloat16 (no autocast).
PRECISIONS = {
    "fp32": "float32, TF32 tensor cores off",
    "tf32": "float32 storage, TF32 tensor-core matmuls/convolutions",
    "bf16": "bfloat16 autocast (fp32 weights and optimizer)",
    "fp16": "float16 autocast with GradScaler",
    "bf16-pure": "model, activations and optimizer state in bfloat16",
}


# what optimizer.zero_grad() does between steps. "zeros" is torch < 2.0's default (set_to_none=False) and
# what transformers' Trainer did then (`model.zero_grad()`): the gradients stay allocated through the next
# forward (torch/optim/optimizer.py `zero_grad`; torch 2.0 release notes: set_to_none=True by default)
ZERO_GRAD = {
    "none": "zero_grad(set_to_none=True): gradients freed between steps (torch >= 2.0 default)",
    "zeros": "zero_grad(set_to_none=False): gradients kept, zeroed in place (torch < 2.0 default)",
}


def check_precision(precision: str) -> str:
    p = precision.lower()
    if p not in PRECISIONS:
        raise GpuwiseError(f"unknown precision {precision!r}; choose from: {', '.join(PRECISIONS)}")
    return p


def device_type(device) -> str:
    return str(device).split(":")[0]


def map_tensors(fn: Callable[[Any], Any], batch: Any) -> Any:
    """The one walk over a nested batch (Tensor / tuple / list / Mapping, nested; anything else kept as is):
    `fn` applied to every tensor, the structure rebuilt (a Mapping becomes a dict). Not torch.utils._pytree:
    it treats unregistered Mappings (transformers' BatchEncoding) as leaves."""
    import torch

    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return {k: map_tensors(fn, v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(map_tensors(fn, v) for v in batch)
    return batch


def tensors_in(batch: Any) -> list:
    """Every tensor of a nested batch, in order (`map_tensors`'s walk)."""
    found: list = []
    map_tensors(found.append, batch)
    return found


def move_to(batch: Any, device, non_blocking: bool = False, float_dtype=None):
    """Move a Tensor / tuple / list / dict batch to `device` (floats optionally cast to `float_dtype`)."""
    def move(t):
        t = t.to(device, non_blocking=non_blocking)
        return t.to(float_dtype) if float_dtype is not None and t.is_floating_point() else t

    return map_tensors(move, batch)


def batch_bytes(batch: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_in(batch))


def enable_checkpointing(model, policy: str | bool = "full") -> int:
    """Turn on activation checkpointing; returns how many blocks are recomputed in backward.

    `policy` "full" recomputes each block whole; "selective" keeps what torchtitan's per-op selective
    checkpointing keeps (gpuwise/sac.py: attention and every other matmul output).

    A `transformers` model uses its own `gradient_checkpointing_enable`; otherwise the children of the
    largest ModuleList/Sequential (the repeated blocks) are wrapped in non-reentrant
    `torch.utils.checkpoint.checkpoint`, which is what users do by hand.
    """
    import torch
    from torch.utils.checkpoint import checkpoint

    kw: dict = {"use_reentrant": False}
    if policy == "selective":
        kw["context_fn"] = selective_context_fn
    if getattr(model, "supports_gradient_checkpointing", False):
        if hasattr(model, "activation_checkpointing_enable"):  # the name since transformers 5
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
        return sum(1 for m in model.modules() if getattr(m, "gradient_checkpointing", False))
    containers = [m for m in model.modules() if isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential)) and len(m) > 1]
    if not containers:
        raise GpuwiseError("--checkpointing: the model has no ModuleList/Sequential of blocks to checkpoint")
    blocks = max(containers, key=lambda m: (len(m), sum(p.numel() for p in m.parameters())))
    for block in blocks:
        forward = block.forward

        def wrapped(*args, _forward=forward, **kwargs):
            if torch.is_grad_enabled():
                return checkpoint(_forward, *args, **kw, **kwargs)
            return _forward(*args, **kwargs)

        block.forward = wrapped
    return len(blocks)


CHECKPOINTING = {"none": False, "full": True, "selective": "selective"}


def checkpointing_mode(value) -> bool | str:
    """False, True (full) or "selective", from a bool or a `--checkpointing` word."""
    if isinstance(value, bool) or value is None:
        return bool(value)
    if value not in CHECKPOINTING:
        raise GpuwiseError(f"checkpointing must be one of {', '.join(CHECKPOINTING)}, got {value!r}")
    return CHECKPOINTING[value]


@dataclass
class StepConfig:
    optimizer: str | None = None  # None: the workload's optimizer() or AdamW
    precision: str = "fp32"
    checkpointing: bool | str = False  # False / True (= "full") / "selective"
    optimizer_impl: str = "default"
    zero_grad: str = "none"  # "none": zero_grad(set_to_none=True); "zeros": gradients kept, zeroed in place
    # The loop keeps the last loss (and so its autograd graph) until the next step's loss replaces it, as
    # litgpt's finetune loops do (`loss = chunked_cross_entropy(...)` rebound each iteration). Autograd frees
    # what ops saved for backward as backward runs, but not what a custom Function keeps as a ctx attribute
    # (bitsandbytes <= 0.43.1 MatMul4Bit: `ctx.tensors = (A, B)`): that lives as long as the graph does.
    keep_last_loss: bool = False
    # torch <= 1.10: softmax / log_softmax save their input for backward next to the result
    # (plan/tracing/torch_versions.py)
    softmax_saves_input: bool = False

    def __post_init__(self):
        self.precision = check_precision(self.precision)
        self.checkpointing = checkpointing_mode(self.checkpointing)
        if self.zero_grad not in ZERO_GRAD:
            raise GpuwiseError(f"unknown zero_grad {self.zero_grad!r}; choose from: {', '.join(ZERO_GRAD)}")
        if self.optimizer is not None:
            self.optimizer = optimizer_name(self.optimizer)


def uses_grad_scaler(config: StepConfig) -> bool:
    """Whether the step trains with a GradScaler (fp16 autocast's dynamic loss scaling): TrainStep makes one."""
    return config.precision == "fp16"


class TrainStep:
    """A model, optimizer and scaler on a device, and `step(batch)` running one training step."""
    def __init__(self, workload, config: StepConfig, device="cpu", model=None):
        import torch

        self.workload = workload
        self.config = config
        self.device = torch.device(device)
        dtype = device_type(self.device)
        self.model = model if model is not None else workload.build_model()
        if config.checkpointing:
            enable_checkpointing(self.model, "selective" if config.checkpointing == "selective" else "full")
        if config.precision == "bf16-pure":
            self.model = self.model.to(torch.bfloat16)
        self.model = self.model.to(self.device)
        self.model.train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        if config.optimizer is None and workload.optimizer_fn is not None:
            self.optimizer = workload.optimizer_fn(params)
        else:
            self.optimizer = make_optimizer(config.optimizer or "adamw", params, config.optimizer_impl)
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(config.precision)
        self.scaler = None
        if uses_grad_scaler(config):
            self.scaler = torch.amp.GradScaler(dtype, enabled=dtype in ("cuda", "cpu"))
        self.float_dtype = torch.bfloat16 if config.precision == "bf16-pure" else None
        self._last_loss = None  # config.keep_last_loss: the last step's loss, graph attached

    def _hold(self, loss) -> None:
        self._last_loss = loss  # the loss held before, and its graph, are released only now

    def autocast(self):
        import torch

        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type(self.device), dtype=self.autocast_dtype)

    def to_device(self, batch, non_blocking: bool = False):
        return move_to(batch, self.device, non_blocking=non_blocking, float_dtype=self.float_dtype)

    def step(self, batch, on_device: bool = False):
        """One training step; returns the detached loss. `batch` is moved to the device unless `on_device`."""
        if not on_device:
            batch = self.to_device(batch)
        with tf32_mode(self.config.precision == "tf32"):
            holder = _LOSS_HOLDER.set(self._hold if self.config.keep_last_loss else None)
            try:
                with self.autocast():
                    loss = self.workload.compute_loss(self.model, batch)
            finally:
                _LOSS_HOLDER.reset(holder)
            if self.config.keep_last_loss:
                self._hold(loss)
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                loss.backward()
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=self.config.zero_grad == "none")
        return loss.detach()


_LOSS_HOLDER: contextvars.ContextVar = contextvars.ContextVar("gpuwise_loss_holder", default=None)


def hold_loss(loss) -> None:
    """Inside a step with `keep_last_loss`, a micro-batch's loss (gradient accumulation) replaces the loss
    the loop holds, as the loop's `loss = ...` does each iteration; elsewhere nothing."""
    holder = _LOSS_HOLDER.get()
    if holder is not None:
        holder(loss)


def loop_keeps_last() -> bool:
    """Inside a step with `keep_last_loss`: the loop keeps what its last iteration bound until the next
    iteration rebinds it. A loss function whose script keeps more than the loss (litgpt's loop: `logits =
    model(...)`) keeps that itself, released when the next call's value replaces it."""
    return _LOSS_HOLDER.get() is not None


@contextlib.contextmanager
def tf32_mode(enabled: bool):
    """TF32 matmuls/convolutions on (tf32) or off (everything else), restored afterwards."""
    import torch

    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
