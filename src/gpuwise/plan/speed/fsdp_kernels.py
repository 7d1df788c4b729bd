"""The kernels an FSDP job runs around its collectives, added to a trace's op costs: FSDP1's (flat parameters,
fsdp1.py) or FSDP2's (`fully_shard`, fsdp2.py), per unit and micro-batch. Used by `estimate` and by `fit`'s
options, so that an option's speed is its `estimate_cmd`'s."""

from __future__ import annotations

from ..memory.split import Split
from . import fsdp1, fsdp2
from .ops import OpCosts

# the strategies whose copies around the collectives are added (plan/memory/split.py names)
FSDP_KERNELS = ("fsdp", "fsdp-grad-op", "hsdp")


def with_fsdp_kernels(costs: OpCosts, split: Split, grad_bytes: int, precision: str, micro_steps: int,
                      blocks: int) -> OpCosts:
    """`costs` plus the kernels FSDP runs around its collectives in each of `micro_steps` micro-batches
    (plan/speed/fsdp1.py for FSDP1's flat parameters, fsdp2.py for fully_shard), for a model of `blocks`
    transformer blocks (its units: the blocks and the root) whose traced gradients are `grad_bytes`, 16-bit
    under a `-pure` precision, else fp32: every micro-batch reduces under --accum-sync every (the sharded
    gradients accumulate from the second on), else only the last (no_sync)."""
    grad_itemsize = 2 if precision.endswith("-pure") else 4
    units = blocks + 1
    elements = grad_bytes / grad_itemsize
    out = costs.scaled(1.0)
    micro_steps = max(1, micro_steps)
    every = split.sync_every_micro_step or micro_steps == 1
    kinds = ([(True, False)] + [(True, True)] * (micro_steps - 1) if every else
             [(False, False)] * (micro_steps - 1) + [(True, False)])
    for reduce, accumulate in kinds:
        if split.flat_params:
            moved = fsdp1.kernel_bytes(elements, split.shards, grad_itemsize, split.param_dtype, split.reduce_dtype,
                                       reduce=reduce, accumulate=accumulate)
            per_unit = fsdp1.kernels_per_unit(split.param_dtype, split.reduce_dtype, split.shards, reduce=reduce,
                                              accumulate=accumulate)
        else:
            mixed = {"param_dtype": split.param_dtype, "reduce_dtype": split.reduce_dtype} if split.param_dtype else {}
            shape = {"reshard_after_forward": split.strategy != "fsdp-grad-op", "reduce": reduce,
                     "accumulate": accumulate, **mixed}
            shard_itemsize = 4 if split.param_dtype else grad_itemsize
            moved = {(phase, "vectorized"): nbytes for phase, nbytes in fsdp2.kernel_bytes(
                elements, split.shards, grad_itemsize, shard_itemsize, **shape).items()}
            per_unit = fsdp2.kernels_per_unit(grad_itemsize=grad_itemsize, shard_itemsize=shard_itemsize, **shape)
        for key, nbytes in moved.items():
            out.memory_bytes[key if key[1] != "vectorized" else key[0]] += nbytes
        for phase, kernels in per_unit.items():
            out.kernels[phase] += kernels * units
    return out
