"""The kernels FSDP2 (`fully_shard`) runs around its collectives, which a trace of the unsharded model does not
see: memory-bound copies into and out of the collectives' flat buffers, per unit (a `fully_shard`ed module) and
micro-batch (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py; the same ops from torch 2.4, where
FSDP2 began to use them, to 2.13):

    all-gather copy-in   `foreach_all_gather` -> `torch.ops.fsdp.all_gather_copy_in`: one `_foreach_copy_` of the
                         rank's shards into its slice of the all-gather buffer, cast to MixedPrecisionPolicy's
                         param_dtype on the way (reads the fp32 shard, writes the param_dtype one): before every
                         all-gather, forward and (reshard_after_forward, the default) backward again
    all-gather copy-out  `foreach_all_gather_copy_out` -> `torch.ops.fsdp.split_with_sizes_copy`: the gathered
                         buffer copied into the unit's unsharded parameters (reads and writes every element of
                         the unit in param_dtype)
    reduce-scatter in    `foreach_reduce` -> `foreach_reduce_scatter_copy_in` -> `torch.ops.fsdp.chunk_cat`: the
                         unsharded gradients copied, chunked by rank, into the reduce-scatter input in reduce_dtype
                         (reads every gradient element, writes it in reduce_dtype: a bf16 -> fp32 cast in the same
                         kernel)
    divides              `_get_gradient_divide_factors`: none in fp32 or bf16 (NCCL's ReduceOp.AVG divides);
                         fp16 reduces with a pre-divide of the input and a post-divide of the output (in place)
    shard cast           `_to_dtype_if_needed(reduce_output, orig_dtype)`: a reduce_dtype other than the fp32
                         parameter's (bf16) casts the output shard up
    accumulation         `sharded_param.grad += new_sharded_grad` when a sharded gradient is kept from an earlier
                         micro-batch (reduced on every one)

Checked against real `fully_shard` on 2 gloo CPU ranks (tests/test_plan_speed_fsdp2.py logs each op's tensors).
Bytes are read + written, priced as ops.py's vectorised path (plan/speed/memory_bound.py); the copies run on
FSDP's all-gather copy-in and reduce-scatter streams beside the compute, priced as compute-stream time since
they hold the SMs and the memory bandwidth the compute beside them needs (as fsdp1.py counts FSDP1's).
"""

from __future__ import annotations

ITEMSIZE = {"fp32": 4, "bf16": 2, "fp16": 2}


def kernel_bytes(elements: float, shards: int, grad_itemsize: int, shard_itemsize: int = 4,
                 param_dtype: str | None = None, reduce_dtype: str | None = None,
                 reshard_after_forward: bool = True, reduce: bool = True,
                 accumulate: bool = False) -> dict[str, float]:
    """{phase: bytes} FSDP2 moves in one micro-batch of one rank beyond the traced ops, for `elements` trained
    parameters sharded over `shards` ranks. `grad_itemsize`: a computed gradient element's bytes (2 under
    param_dtype bf16); `shard_itemsize`: a sharded parameter element's (4: fp32 shards); `param_dtype` /
    `reduce_dtype`: MixedPrecisionPolicy (None: the parameters' own dtype, the gradients'); `reshard_after_forward`:
    all-gathers again in backward (fully_shard's default; False for SHARD_GRAD_OP-like use); `reduce`: this
    micro-batch reduce-scatters (False under set_requires_gradient_sync(False) but the last); `accumulate`: its
    output is added into a sharded gradient kept from an earlier micro-batch."""
    out: dict[str, float] = {}

    def add(phase: str, nbytes: float) -> None:
        if nbytes > 0:
            out[phase] = out.get(phase, 0.0) + nbytes

    shard = elements / max(shards, 1)
    gathered = ITEMSIZE[param_dtype] if param_dtype else shard_itemsize
    gather = (shard_itemsize + gathered) * shard + 2 * gathered * elements  # copy-in, copy-out
    add("forward", gather)
    if reshard_after_forward:
        add("backward", gather)
    if not reduce:
        return out
    red = ITEMSIZE[reduce_dtype] if reduce_dtype else grad_itemsize
    add("backward", (grad_itemsize + red) * elements)  # chunk_cat into the reduce-scatter input
    if reduce_dtype == "fp16":
        add("backward", 2 * red * elements + 2 * red * shard)  # pre- and post-divide in place
    if red != shard_itemsize:
        add("backward", (red + shard_itemsize) * shard)  # the output shard cast to the parameter's dtype
    if accumulate:
        add("backward", 3 * shard_itemsize * shard)
    return out


def kernels_per_unit(param_dtype: str | None = None, reduce_dtype: str | None = None,
                     reshard_after_forward: bool = True, reduce: bool = True, accumulate: bool = False,
                     grad_itemsize: int = 4, shard_itemsize: int = 4) -> dict[str, int]:
    """{phase: kernels} of `kernel_bytes` for one unit: copy-in and copy-out per all-gather, then chunk_cat,
    the divides, the shard cast and the accumulation where they run (one launch each: `_foreach_copy_` and
    the accumulation over a unit's parameters are counted as one)."""
    backward = 2 if reshard_after_forward else 0
    if reduce:
        red = ITEMSIZE[reduce_dtype] if reduce_dtype else grad_itemsize
        backward += 1 + 2 * (reduce_dtype == "fp16") + (red != shard_itemsize) + accumulate
    return {"forward": 2, "backward": backward}
