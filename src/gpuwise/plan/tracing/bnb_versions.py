"""What older bitsandbytes releases kept alive that the installed one does not (QLoRA memory by version).

gpuwise traces the installed bitsandbytes. A published QLoRA measurement ran the release of its time, and
one change moved its memory a lot: up to bitsandbytes 0.43.1, `MatMul4Bit.forward` kept its input in
`ctx.tensors = (A, B)` whenever an input needed grad, although a frozen 4-bit weight needs only grad_A
(which uses B): every quantized linear layer's input stayed alive until its backward. PR #1270
("delete useless buffered activation", bitsandbytes-foundation/bitsandbytes, merged 2024-07-16, released
in the 0.43.2 patch release) stores `(None, B)` instead. `--bnb-version` below 0.43.2 puts A back.

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

KEEPS_INPUT_BEFORE = (0, 43, 2)   # first release with PR #1270
DEQUANT_PREFILL_BEFORE = (0, 50, 0)   # first release taken to have PR #1949's fused multi-token kernels


def parse_version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.strip().split(".")[:3])
    except ValueError:
        raise GpuwiseError(f"--bnb-version: expected a release like 0.41.1, got {text!r}") from None


def keeps_matmul_input(version: str | None) -> bool:
    return version is not None and parse_version(version) < KEEPS_INPUT_BEFORE


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
    """Inside, bitsandbytes' 4-bit matmul keeps what `version` kept (a no-op for current releases)."""
    if not keeps_matmul_input(version):
        yield
        return
    from bitsandbytes.autograd import _functions as bnb_fn

    cls = bnb_fn.MatMul4Bit
    original = cls.forward

    def forward(ctx, A, B, *args, **kwargs):
        out = original(ctx, A, B, *args, **kwargs)
        if getattr(ctx, "tensors", None) is not None and ctx.tensors[1] is not None:
            ctx.tensors = (A, ctx.tensors[1])   # as bitsandbytes <= 0.43.1: the input kept for backward
        return out

    cls.forward = staticmethod(forward)
    try:
        yield
    finally:
        cls.forward = staticmethod(original)
