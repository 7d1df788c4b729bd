"""Libraries that only some options need (peft, bitsandbytes): is each here, and what stands in for sizing.

A base install (`pip install gpuwise`) has neither. The planner still answers: an option whose bytes are
known without the library is sized from that layout (bitsandbytes' 8-bit AdamW state, below), the
others are listed with the command that installs what they need. Nothing here runs a real step: the
stand-ins exist only for fake-tensor traces.
"""

from __future__ import annotations

import importlib.util
from functools import cache

INSTALL = {"peft": "pip install peft", "bitsandbytes": "pip install bitsandbytes"}


@cache
def available(name: str) -> bool:
    """True when `import name` would find the package (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def imported(name: str):
    """The module `name` (peft, bitsandbytes), imported with torch.compile deferred while it loads.

    bitsandbytes (which peft imports too) wraps its default CPU kernels in torch.compile as it loads, and
    torch.compile imports torch's inductor to do so: ~1 s of every process that sizes LoRA, QLoRA or 8-bit
    AdamW (`import peft`: 3.2 -> 2.2 s CPU). Deferred, each function is compiled by the real torch.compile
    with the same arguments the first time it is called (a fake-tensor trace calls none of them), and a
    compile error there falls back as bitsandbytes' own wrapper makes it. Already imported: as it is."""
    import importlib
    import sys

    if name in sys.modules:
        return sys.modules[name]
    import torch

    real = torch.compile
    torch.compile = _deferred_compile(real)
    try:
        return importlib.import_module(name)
    finally:
        torch.compile = real


def _deferred_compile(real):
    """A torch.compile that compiles a plain function only when it is first called (anything else: at once)."""
    import functools
    import types

    def deferred(model=None, **kwargs):
        if model is None:  # used as @torch.compile(...): the decorator
            return lambda fn: deferred(fn, **kwargs)
        if not isinstance(model, types.FunctionType):
            return real(model, **kwargs)
        compiled = []

        @functools.wraps(model)
        def call(*args, **kw):
            if not compiled:
                compiled.append(real(model, **kwargs))
            return compiled[0](*args, **kw)
        return call
    return deferred


def missing(names) -> list[str]:
    """The packages of `names` that are not installed, in order."""
    return [n for n in dict.fromkeys(names) if not available(n)]


def install_hint(names) -> str:
    """'pip install peft bitsandbytes' for the missing packages `names`."""
    return "pip install " + " ".join(names)


# bitsandbytes' 8-bit AdamW state, from bitsandbytes/optim/optimizer.py `Optimizer2State.init_state`
# (0.46-0.50): a parameter of at least `min_8bit_size` = 4096 elements gets state1/state2 as uint8
# (one byte per element each) and absmax1/absmax2 as fp32, one per 256-element block; smaller ones get
# fp32 state1/state2. The two 256-entry fp32 quantization maps (`dynamic`, `udynamic`) are created once
# and moved to the device once, shared by every parameter. `step` is a Python int. The update
# (`optimizer_update_8bit_blockwise` / `optimizer_update_32bit`) is one in-place kernel per parameter.
BNB_MIN_8BIT_SIZE = 4096
BNB_BLOCKSIZE = 256
BNB_QMAP_ENTRIES = 256


def adamw8bit_layout(params, lr: float = 1e-3):
    """A torch optimizer that holds exactly the state tensors bitsandbytes' AdamW8bit would, with an
    in-place update: sizes the 8-bit AdamW option in a fake trace when bitsandbytes is not installed."""
    import torch

    class AdamW8bitLayout(torch.optim.Optimizer):
        def __init__(self, params, lr):
            super().__init__(params, {"lr": lr})
            self._qmaps = None

        @torch.no_grad()
        def step(self, closure=None):
            loss = closure() if closure is not None else None
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = self.state[p]
                    if not state:
                        self._init_state(p, state)
                    state["step"] += 1
                    p.add_(p.grad, alpha=-group["lr"])  # one in-place kernel, as bitsandbytes' update
            return loss

        def _init_state(self, p, state):
            state["step"] = 0
            n = p.numel()
            if n < BNB_MIN_8BIT_SIZE:
                state["state1"] = torch.zeros_like(p, dtype=torch.float32)
                state["state2"] = torch.zeros_like(p, dtype=torch.float32)
                return
            if self._qmaps is None:
                self._qmaps = tuple(torch.zeros(BNB_QMAP_ENTRIES, dtype=torch.float32, device=p.device)
                                    for _ in range(2))
            blocks = -(-n // BNB_BLOCKSIZE)
            state["state1"] = torch.zeros_like(p, dtype=torch.uint8)
            state["state2"] = torch.zeros_like(p, dtype=torch.uint8)
            state["qmap1"], state["qmap2"] = self._qmaps
            state["absmax1"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)
            state["absmax2"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)

    return AdamW8bitLayout(params, lr)


def all_fake(params) -> bool:
    """True when every parameter is a fake tensor (a trace, not a real step)."""
    from torch._subclasses.fake_tensor import FakeTensor

    params = list(params)
    return bool(params) and all(isinstance(p, FakeTensor) for p in params)


SIZED_WITHOUT = {
    "adamw8bit": ("bitsandbytes", "8-bit AdamW sized from bitsandbytes' state layout without the library "
                                  "(uint8 states + one fp32 absmax per 256 elements; to train with it: "
                                  "pip install bitsandbytes)"),
}
LORA_WITHOUT_PEFT = ("LoRA sized with a stand-in for peft's LoRA layers (fp32 rank-r adapters on every linear "
                     "layer but the head, peft's forward); to train with it: pip install peft")


def sized_without_notes(optimizer: str | None, lora: bool = False) -> list[str]:
    """Notes for what a trace sized with a stand-in because its library is missing."""
    entry = SIZED_WITHOUT.get(optimizer or "")
    notes = [entry[1]] if entry is not None and not available(entry[0]) else []
    return notes + ([LORA_WITHOUT_PEFT] if lora and not available("peft") else [])


# peft's LoRA on nn.Linear, as `get_peft_model(model, LoraConfig(r, lora_alpha, lora_dropout=0.0,
# target_modules="all-linear"))` builds it (peft 0.13-0.21, peft/tuners/lora/layer.py `Linear.forward`):
# every nn.Linear but the output embedding gets lora_A (in -> r) and lora_B (r -> out), no bias, kept in
# fp32 (`autocast_adapter_dtype=True`; gpuwise keeps them bf16 for bf16-pure, `adapter_dtype`); dropout 0 is nn.Identity; forward is
# `result = base(x); x = x.to(lora_A.weight.dtype); result = result + lora_B(lora_A(x)) * scaling;
# result.to(base result dtype)`. The base is frozen by the caller.
def lora_layout(model, rank: int, alpha: float, adapter_dtype=None):
    """Wrap the model's nn.Linear layers (but the output head) as peft's LoRA would, without peft: for
    sizing a LoRA option in a fake trace. Returns the model (changed in place)."""
    import torch

    adapter_dtype = adapter_dtype or torch.float32

    class LoraLinearLayout(torch.nn.Module):
        def __init__(self, base: torch.nn.Linear):
            super().__init__()
            self.base_layer = base
            device = base.weight.device
            self.lora_A = torch.nn.Linear(base.in_features, rank, bias=False, device=device, dtype=adapter_dtype)
            self.lora_B = torch.nn.Linear(rank, base.out_features, bias=False, device=device, dtype=adapter_dtype)
            self.scaling = alpha / rank

        def forward(self, x, *args, **kwargs):
            result = self.base_layer(x, *args, **kwargs)
            result_dtype = result.dtype
            if x.dtype != self.lora_A.weight.dtype:
                x = x.to(self.lora_A.weight.dtype)
            result = result + self.lora_B(self.lora_A(x)) * self.scaling
            return result.to(result_dtype)

    get_out = getattr(model, "get_output_embeddings", None)
    head = get_out() if callable(get_out) else None
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear and child is not head:
                setattr(module, name, LoraLinearLayout(child))
    return model
