"""`torch._grouped_mm` (the mixture-of-experts GEMM: transformers' `grouped_mm` experts, torchtitan's) in
float32 or float16 under fake tensors, as CUDA runs it.

CUDA's kernel (aten/src/ATen/native/cuda/GroupedBlas.cpp `_grouped_mm_cuda`) runs bf16 operands on its fast
path (one CUTLASS grouped kernel, sm90 / sm100) and any other dtype it validates (float32, float16) on
`_grouped_mm_fallback`: an mm per group written into the same output. torch's meta kernel
(torch/_meta_registrations.py `_meta_grouped_mm_common`) admits bf16 only, so a fake-tensor step whose experts
multiply in float32 fails there: transformers casts the tokens to the experts' weight dtype, float32 for
master weights under autocast (transformers/integrations/moe.py `_grouped_mm`). `output` makes the output as
CUDA's `create_grouped_gemm_output_tensor` does (the meta kernel's shapes; the last dimension's stride padded
to 16 bytes on CUDA), with no other allocation: the fallback copies only the offsets to the host.
"""

from __future__ import annotations

from ..speed.composite_ops import grouped_mm_operands


def _op():
    import torch

    packet = getattr(torch.ops.aten, "_grouped_mm", None)  # torch >= 2.8
    return None if packet is None else packet.default


GROUPED_MM = _op()


def needs_output(func, args) -> bool:
    """The call is a grouped GEMM torch's meta kernel refuses and CUDA runs: fake operands, not both bf16."""
    if func is not GROUPED_MM or GROUPED_MM is None or len(args) < 2:
        return False
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    a, b = args[0], args[1]
    return (isinstance(a, FakeTensor) and isinstance(b, FakeTensor)
            and (a.dtype, b.dtype) != (torch.bfloat16, torch.bfloat16))


def output(args, kwargs, target: str):
    """The output tensor of `_grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None)`, allocated where
    the operands live (below this dispatch mode: a fake tensor)."""
    import torch

    a, b, offs, out_dtype = grouped_mm_operands(args, kwargs)
    if a.dim() == 2:
        size = [offs.size(0), a.size(0), b.size(1)] if b.dim() == 2 else [a.size(0), b.size(-1)]
    else:
        size = [a.size(1), b.size(1)] if b.dim() == 2 else [a.size(0), a.size(1), b.size(-1)]
    dtype = out_dtype or a.dtype
    if target != "cuda":
        return torch.empty(size, dtype=dtype, device=a.device)
    align = 16 // dtype.itemsize
    padded = (size[-1] + align - 1) // align * align
    stride = [size[1] * padded, padded, 1] if len(size) == 3 else [padded, 1]
    return torch.empty_strided(size, stride, dtype=dtype, device=a.device)
