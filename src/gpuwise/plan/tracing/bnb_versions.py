"""What older bitsandbytes releases kept alive that the installed one does not (QLoRA memory by version).

gpuwise traces the installed bitsandbytes. A published QLoRA measurement ran the release of its time, and
one change moved its memory a lot: up to bitsandbytes 0.43.1, `MatMul4Bit.forward` kept its input in
`ctx.tensors = (A, B)` whenever an input needed grad, although a frozen 4-bit weight needs only grad_A
(which uses B): every quantized linear layer's input stayed alive until its backward. PR #1270
("delete useless buffered activation", bitsandbytes-foundation/bitsandbytes, merged 2024-07-16, released
in the 0.43.2 patch release) stores `(None, B)` instead. `--bnb-version` below 0.43.2 puts A back.
"""

from __future__ import annotations

import contextlib

from ...errors import GpuwiseError

KEEPS_INPUT_BEFORE = (0, 43, 2)   # first release with PR #1270


def parse_version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.strip().split(".")[:3])
    except ValueError:
        raise GpuwiseError(f"--bnb-version: expected a release like 0.41.1, got {text!r}") from None


def keeps_matmul_input(version: str | None) -> bool:
    return version is not None and parse_version(version) < KEEPS_INPUT_BEFORE


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
