"""What older bitsandbytes releases did that the installed one does not (QLoRA memory by version).

gpuwise traces the installed bitsandbytes. A published QLoRA measurement ran the release of its time, and
three changes moved its memory:
- up to bitsandbytes 0.43.1, `MatMul4Bit.forward` kept its input in `ctx.tensors = (A, B)` whenever an
  input needed grad, although a frozen 4-bit weight needs only grad_A (which uses B): every quantized
  linear layer's input stayed alive with the graph. PR #1270 ("delete useless buffered activation",
  bitsandbytes-foundation/bitsandbytes, merged 2024-07-16, released in the 0.43.2 patch release) stores
  `(None, B)` instead. `--bnb-version` below 0.43.2 puts A back. A ctx attribute is not one of the tensors
  autograd releases as backward runs: it lives as long as the graph (see StepConfig.keep_last_loss).
- up to bitsandbytes 0.49.x, `MatMul4Bit.forward` ran `F.linear(A, F.dequantize_4bit(B, quant_state)
  .to(A.dtype).t(), bias)`: the whole weight dequantized in 16 bits (quant_state.dtype, then cast to A's
  dtype when that differs) alive through the matmul, one layer at a time. 0.50.0 (PR #1949, "New 4bit GEMM
  kernels") calls the fused `gemm_4bit` op, which the trace cannot see into. `--bnb-version` below 0.50.0
  allocates the dequantized weight (and its cast) around the installed forward, as the old one held them.
- up to bitsandbytes 0.42.x, `Params4bit.cuda` quantized `self.data.contiguous().half()`: the quant_state
  dtype is float16 whatever the model's dtype (0.43.0 quantizes the weight in its own dtype), so a bf16
  compute dequantizes to fp16 and casts (`quantizes_from_fp16`; plan/tracing/modes.py applies it).

Inference (no grad): up to PR #1949 ("[CUDA] New 4bit GEMM kernels for inference", merged 2026-05-15;
the installed 0.50.2 has it, so 0.50.0 is taken as its first release) `matmul_4bit` ran the fused GEMV
only for a single token (`A.numel() == A.shape[-1]`) and otherwise `MatMul4Bit`: `F.dequantize_4bit(B)`
into a 16-bit copy of the whole weight, then `F.linear`, so a multi-token prefill held one layer's
dequantized weight at a time. `--bnb-version` below 0.50.0 routes a multi-token no-grad 4-bit matmul that
way again (e.g. 0.42.0, the release litgpt's generate pins).
"""

from __future__ import annotations

import contextlib

from ...errors import GpuwiseError

KEEPS_INPUT_BEFORE = (0, 43, 2)      # first release with PR #1270
DEQUANTIZES_IN_FORWARD_BEFORE = (0, 50, 0)  # first release whose MatMul4Bit.forward calls gemm_4bit (PR #1949)
QUANTIZES_FROM_FP16_BEFORE = (0, 43, 0)     # first release whose Params4bit.cuda keeps the weight's dtype
DEQUANT_PREFILL_BEFORE = (0, 50, 0)   # first release taken to have PR #1949's fused multi-token kernels


def parse_version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.strip().split(".")[:3])
    except ValueError:
        raise GpuwiseError(f"--bnb-version: expected a release like 0.41.1, got {text!r}") from None


def keeps_matmul_input(version: str | None) -> bool:
    return version is not None and parse_version(version) < KEEPS_INPUT_BEFORE


def quantizes_from_fp16(version: str | None) -> bool:
    return version is not None and parse_version(version) < QUANTIZES_FROM_FP16_BEFORE


def dequantizes_in_forward(version: str | None) -> bool:
    return version is not None and parse_version(version) < DEQUANTIZES_IN_FORWARD_BEFORE


def dequantizes_prefill(version: str | None) -> bool:
    return version is not None and parse_version(version) < DEQUANT_PREFILL_BEFORE


@contextlib.contextmanager
def bitsandbytes_inference_as(version: str | None):
    """Inside, a no-grad multi-token 4-bit matmul dequantizes its weight as `version` did (a no-op for
    current releases)."""
    if not dequantizes_prefill(version):
        yield
        return
    import bitsandbytes as bnb
    import torch
    from bitsandbytes import functional as F

    original = bnb.matmul_4bit

    def matmul_4bit(A, B, quant_state, out=None, bias=None):
        needs_grad = torch.is_grad_enabled() and (A.requires_grad or (bias is not None and bias.requires_grad))
        if needs_grad or A.numel() == A.shape[-1]:   # training, or one token: the GEMV (no copy)
            return original(A, B, quant_state, out=out, bias=bias)
        weight = F.dequantize_4bit(B, quant_state).to(A.dtype)   # (out, in): the 16-bit copy
        return torch.nn.functional.linear(A, weight, bias)

    bnb.matmul_4bit = matmul_4bit
    try:
        yield
    finally:
        bnb.matmul_4bit = original


@contextlib.contextmanager
def bitsandbytes_as(version: str | None):
    """Inside, bitsandbytes' 4-bit matmul keeps and allocates what `version` did (a no-op for current releases)."""
    keeps, dequantizes = keeps_matmul_input(version), dequantizes_in_forward(version)
    if not (keeps or dequantizes):
        yield
        return
    from bitsandbytes import functional as bnb_f
    from bitsandbytes.autograd import _functions as bnb_fn

    cls = bnb_fn.MatMul4Bit
    original = cls.forward

    def forward(ctx, A, B, *args, **kwargs):
        state = kwargs.get("quant_state", args[2] if len(args) > 2 else None)
        weight = None
        if dequantizes and state is not None and A.numel():
            # the old forward's operand: the 16-bit weight (cast to A's dtype), alive through the matmul
            weight = bnb_f.dequantize_4bit(B.view(-1, 1), state).to(A.dtype)
        out = original(ctx, A, B, *args, **kwargs)
        del weight
        if keeps and getattr(ctx, "tensors", None) is not None and ctx.tensors[1] is not None:
            ctx.tensors = (A, ctx.tensors[1])   # as bitsandbytes <= 0.43.1: the input kept for backward
        return out

    cls.forward = staticmethod(forward)
    try:
        yield
    finally:
        cls.forward = staticmethod(original)
