"""The kernels FSDP1 (FullyShardedDataParallel, flat parameters) runs around its collectives, which a trace
of the unsharded model does not see: memory-bound copies, casts and divisions over each unit's flat
parameter or gradient, every micro-batch (torch/distributed/fsdp/_flat_param.py, _runtime_utils.py; the
same code from torch 1.13 to 2.x):

    all-gather input   with MixedPrecision(param_dtype): `FlatParamHandle._use_low_precision_shard`
                       copies the fp32 local shard into the low-precision shard (`_mp_shard.copy_`, a cast)
                       before every all-gather: forward, and backward again under FULL_SHARD
    flat gradient      the unit's parameters are views of its flat parameter (`_use_unsharded_views`), so
                       autograd builds the flat gradient by SplitWithSizesBackward: a `cat` of the unit's
                       gradients (read + write, in the gradient dtype)
    reduce dtype       `_post_backward_hook`: `flat_param.grad.to(handle._reduce_dtype)` when the gradient
                       (param_dtype) differs from reduce_dtype (DEFAULT: bf16 -> fp32, the whole unsharded
                       gradient)
    pre-divide         `_reduce_grad`: `_div_if_needed(padded_unsharded_grad, _gradient_predivide_factor)`
                       in place on the reduce-scatter input; the factor is
                       `DefaultState._get_gradient_predivide_factor(world_size)` (default_hooks.py: doubled
                       while it divides the world size and is below world / factor: 2 for 2-4 ranks, 4 for 8)
    post-divide        `_div_if_needed(new_sharded_grad, world / predivide)` on the output shard when > 1
    shard cast         `_accumulate_sharded_grad` -> `_cast_grad_to_param_dtype`: a reduce-scatter output in
                       another dtype than the fp32 parameter (PURE: bf16) is cast to fp32
    accumulation       `flat_param._saved_grad_shard += sharded_grad` from the second reduction of a step on
                       (micro-batches that each reduce: Composer)

Bytes are read + written; the kernel path (plan/speed/memory_bound.py) as ops.py `_kernel_path` gives it:
a cast to fp32 has no vectorised copy (unrolled), the fp32 -> bf16 copy and the rest are vectorised.
The hook's kernels run on FSDP's pre-unshard and post-backward streams beside the compute; they are
priced as compute-stream time, since they hold the SMs and the memory bandwidth that the compute beside
them needs (as overlap.py counts NCCL's SMs): their cost lies between that and their exposed part only.
"""

from __future__ import annotations

ITEMSIZE = {"fp32": 4, "bf16": 2, "fp16": 2}


def predivide_factor(world_size: int) -> int:
    """torch FSDP1's gradient pre-divide factor (algorithms/_comm_hooks/default_hooks.py
    DefaultState._get_gradient_predivide_factor)."""
    factor = 1
    while world_size % factor == 0 and world_size / factor > factor:
        factor *= 2
    return factor


def kernel_bytes(elements: float, shards: int, grad_itemsize: int, param_dtype: str | None = None,
                 reduce_dtype: str = "fp32", reshard_after_forward: bool = True,
                 reduce: bool = True, accumulate: bool = False) -> dict[tuple[str, str], float]:
    """{(phase, kernel path): bytes} FSDP1 moves in one micro-batch of one rank beyond the traced ops, for a
    model of `elements` parameters (all trainable) sharded over `shards` ranks. `grad_itemsize`: bytes of a
    computed gradient element (2 under param_dtype bf16); `param_dtype` / `reduce_dtype`: MixedPrecision
    (None: no mixed precision, the gradient is reduced as computed); `reshard_after_forward`: FULL_SHARD
    (all-gathers again in backward); `reduce`: this micro-batch reduce-scatters (False under no_sync but the
    last); `accumulate`: its sharded output is added into a shard kept from an earlier micro-batch."""
    out: dict[tuple[str, str], float] = {}

    def add(phase: str, path: str, nbytes: float) -> None:
        if nbytes > 0:
            out[(phase, path)] = out.get((phase, path), 0.0) + nbytes

    shard = elements / max(shards, 1)
    if param_dtype is not None:  # the fp32 shard cast to param_dtype before each all-gather
        cast = shard * (4 + ITEMSIZE[param_dtype])
        add("forward", "vectorized", cast)
        if reshard_after_forward:
            add("backward", "vectorized", cast)
    add("backward", "vectorized", 2 * grad_itemsize * elements)  # SplitWithSizesBackward's cat
    if not reduce:
        return out
    red = ITEMSIZE[reduce_dtype] if param_dtype is not None else grad_itemsize
    if red != grad_itemsize:  # the unsharded gradient to reduce_dtype: a cast up has no vectorised copy
        add("backward", "unrolled" if red > grad_itemsize else "vectorized", (grad_itemsize + red) * elements)
    pre = predivide_factor(shards)
    if pre > 1:
        add("backward", "vectorized", 2 * red * elements)
    if shards / pre > 1:
        add("backward", "vectorized", 2 * red * shard)
    if param_dtype is not None and red != 4:  # the output shard back to the fp32 parameter's dtype
        add("backward", "unrolled", (red + 4) * shard)
    if accumulate:
        add("backward", "vectorized", 3 * 4 * shard if param_dtype is not None else 3 * grad_itemsize * shard)
    return out


def kernels_per_unit(param_dtype: str | None, reduce_dtype: str, shards: int, reshard_after_forward: bool = True,
                     reduce: bool = True, accumulate: bool = False) -> dict[str, int]:
    """{phase: kernels} of `kernel_bytes` for one unit (each kernel one launch per unit)."""
    cast = param_dtype is not None
    backward = 1 + (cast and reshard_after_forward)  # the cat, the all-gather input cast
    if reduce:
        red = reduce_dtype if cast else None
        pre = predivide_factor(shards)
        backward += (pre > 1) + (shards / pre > 1) + accumulate
        if cast:
            backward += (red != param_dtype) + (ITEMSIZE[reduce_dtype] != 4)
    return {"forward": int(cast), "backward": int(backward)}
