"""bitsandbytes' 4-bit linear layers as a trace runs them (QLoRA's base, 4-bit inference).

`quantize_linear_4bit` replaces a model's nn.Linear layers by bitsandbytes' `Linear4bit`, quantized by
bitsandbytes itself (`quantize_4bit`: 0.5 byte per weight plus one absmax per QLORA_BLOCKSIZE weights, with
double quantization uint8 absmax and one fp32 absmax per QLORA_ABSMAX_BLOCK of them; bitsandbytes/functional.py,
QLoRA paper, Dettmers et al. 2023, sec. 3), on fake tensors: bitsandbytes' ops have fake kernels
(bitsandbytes/_ops.py). `nf4_bytes` is what one such weight keeps. Used by the QLoRA mode (plan/tracing/modes.py)
and 4-bit inference (plan/inference.py).
"""

from __future__ import annotations

import math

from ... import optional_libs
from ...errors import GpuwiseError
from ...hf import module_matches

QLORA_BLOCKSIZE = 64       # bitsandbytes Linear4bit default blocksize for 4-bit weights
QLORA_ABSMAX_BLOCK = 256   # blocksize of the double quantization of the absmax values
# bitsandbytes' 4-bit formats as litgpt names them (`--quantize bnb.nf4 / bnb.nf4-dq / bnb.fp4`):
# (quant_type, compress_statistics), bitsandbytes/nn/modules.py Linear4bit.
QLORA_QUANTS = {"nf4-dq": ("nf4", True), "nf4": ("nf4", False), "fp4": ("fp4", False), "fp4-dq": ("fp4", True)}


def quantize_linear_4bit(model, compute_dtype=None, quant_type: str = "nf4", double_quant: bool = True,
                         keep_head: bool = True, from_dtype=None) -> int:
    """Replace every nn.Linear (but the output head, unless `keep_head=False`) by bitsandbytes' Linear4bit
    holding the same weights, quantized by bitsandbytes (as transformers' `replace_with_bnb_linear` +
    loading do) from the weight cast to `from_dtype` (default the compute dtype): the dtype its quant state
    records and `dequantize_4bit` returns. Lightning Fabric's `BitsandbytesPrecision` replaces the head too
    and quantizes from float16 (`_Linear4bit.quantize`)."""
    import torch

    try:
        bnb = optional_libs.imported("bitsandbytes")
    except ImportError as exc:
        raise GpuwiseError("QLoRA needs bitsandbytes (pip install bitsandbytes)") from exc
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():  # its quantization map is built with .tolist(): real data, cached by bnb
        if "dynamic" not in bnb.functional.name2qmap:
            bnb.functional.name2qmap["dynamic"] = bnb.functional.create_dynamic_map()
    _register_gemm_4bit_flops()
    skip = _output_head_names(model) if keep_head else set()
    dtype = compute_dtype or torch.bfloat16
    count = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            # subclasses count (Falcon's FalconLinear): transformers' replace_with_bnb_linear tests isinstance
            if not isinstance(child, torch.nn.Linear) or isinstance(child, bnb.nn.Linear4bit) or full in skip:
                continue
            with unset_fake_temporarily():  # an empty shell on meta (Params4bit cannot wrap a fake tensor)
                q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                      compute_dtype=dtype, compress_statistics=double_quant,
                                      quant_type=quant_type, device="meta")
            # what Params4bit._quantize does, without the Params4bit subclass (it cannot wrap a fake tensor)
            packed, state = bnb.functional.quantize_4bit(child.weight.data.to(from_dtype or dtype),
                                                         blocksize=QLORA_BLOCKSIZE,
                                                         compress_statistics=double_quant, quant_type=quant_type)
            weight = torch.nn.Parameter(packed, requires_grad=False)
            weight.quant_state, weight.quant_type, weight.bnb_quantized = state, quant_type, True
            weight.blocksize, weight.compress_statistics = QLORA_BLOCKSIZE, double_quant
            q.weight = weight
            q.quant_state = state
            for i, t in enumerate(_quant_state_tensors(state)):  # visible to .buffers(): counted and moved
                q.register_buffer(f"quant_state_{i}", t, persistent=False)
            if child.bias is not None:
                q.bias = torch.nn.Parameter(child.bias.data.to(dtype), requires_grad=False)
            setattr(module, child_name, q)
            count += 1
    if count == 0:
        raise GpuwiseError("QLoRA: the model has no nn.Linear layer to quantize")
    return count


def _register_gemm_4bit_flops() -> None:
    """torch.utils.flop_counter has no formula for bitsandbytes' fused 4-bit matmul: 2*M*N*K, as aten.mm."""
    import torch
    import torch.utils.flop_counter as fc

    op = getattr(getattr(torch.ops, "bitsandbytes", None), "gemm_4bit", None)
    if op is None or op in fc.flop_registry:
        return

    @fc.register_flop_formula(op)
    def _gemm_4bit_flop(a_shape, *args, out_shape=None, **kwargs) -> int:
        k = a_shape[-1]
        return 2 * k * math.prod(out_shape)


def _quant_state_tensors(state) -> list:
    import torch

    out = [t for t in (state.absmax, state.code, getattr(state, "offset", None)) if isinstance(t, torch.Tensor)]
    if getattr(state, "state2", None) is not None:
        out += [t for t in (state.state2.absmax, state.state2.code) if isinstance(t, torch.Tensor)]
    return out


def nf4_bytes(numel: int, blocksize: int = QLORA_BLOCKSIZE, double_quant: bool = True) -> int:
    """Bytes bitsandbytes keeps for one 4-bit weight of `numel` elements (functional.py `quantize_4bit`):
    packed uint8 ceil(numel/2); absmax fp32 per block, or with double quantization uint8 per block plus
    fp32 absmax per 256 blocks, the absmax's 256-entry fp32 code book, an fp32 offset, and the 4-bit
    type's own 16-entry fp32 code book."""
    blocks = -(-numel // blocksize)
    packed = -(-numel // 2)
    if not double_quant:
        return packed + 4 * blocks + 4 * 16
    return packed + blocks + 4 * -(-blocks // QLORA_ABSMAX_BLOCK) + 4 * 256 + 4 + 4 * 16


def _output_head_names(model) -> set[str]:
    """Modules never quantized: the output embedding (transformers' `get_keys_to_not_convert`), and the modules
    the model keeps in fp32 (`_keep_in_fp32_modules`, e.g. T5's feed-forward output `wo`), which transformers'
    bitsandbytes quantizer leaves out too (`Bnb4BitHfQuantizer`: `get_modules_to_not_convert(model, ...,
    model._keep_in_fp32_modules)`; T5's forward casts its input to `wo.weight.dtype`, so a 4-bit `wo` breaks)."""
    names = set()
    get_out = getattr(model, "get_output_embeddings", None)
    head = get_out() if callable(get_out) else None
    kept = list(getattr(model, "_keep_in_fp32_modules", None) or ())
    for name, module in model.named_modules():
        if module is head or name.split(".")[-1] in ("lm_head", "score", "classifier") or module_matches(name, kept):
            names.add(name)
    return names
