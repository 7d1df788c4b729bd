"""The kernels an FSDP job runs around its collectives, added to a trace's op costs: FSDP1's (flat parameters,
fsdp1.py) or FSDP2's (`fully_shard`, fsdp2.py), per unit and micro-batch; and, under FSDP1, the optimizer
steps of the views a rank holds (`views_stepped`). Used by `estimate` and by `fit`'s options, so that an
option's speed is its `estimate_cmd`'s."""

from __future__ import annotations

from ..memory.split import Split
from . import fsdp1, fsdp2
from .ops import OpCosts

# the strategies whose copies around the collectives are added (plan/memory/split.py names)
FSDP_KERNELS = ("fsdp", "fsdp-grad-op", "hsdp")


def views_stepped(tensors: int, units: int, shards: int) -> float:
    """Of the `tensors` trainable parameters a trace's optimizer steps one at a time, how many one FSDP1 rank
    steps. FSDP1 (use_orig_params=True, plan/memory/sharding.py) keeps each parameter as a view into its unit's
    flat parameter, of which a rank holds one contiguous 1/`shards` piece; a view with no data in that piece
    gets `grad = None` (torch/distributed/fsdp/_flat_param.py `_use_sharded_grad_views`: "Parameters whose data
    is not present in the sharded flat parameter ... have their gradients set to None"), and torch's
    single-tensor AdamW (`_init_group` takes `p.grad is not None`) or Composer's DecoupledAdamW (`if p.grad is
    None: continue`) skips it. So each of the `units` steps the view its piece starts in plus each of the unit's
    inner boundaries falling inside the piece: on average units + (tensors - units) / shards."""
    units = min(units, tensors)
    return units + (tensors - units) / max(shards, 1)


def with_fsdp_kernels(costs: OpCosts, split: Split, grad_bytes: int, precision: str, micro_steps: int,
                      blocks: int, tensors: int = 0) -> OpCosts:
    """`costs` plus the kernels FSDP runs around its collectives in each of `micro_steps` micro-batches
    (plan/speed/fsdp1.py for FSDP1's flat parameters, fsdp2.py for fully_shard), for a model of `blocks`
    transformer blocks (its units: the blocks and the root) whose traced gradients are `grad_bytes`, 16-bit
    under a `-pure` precision, else fp32: every micro-batch reduces under --accum-sync every (the sharded
    gradients accumulate from the second on), else only the last (no_sync). `tensors`: the trainable parameters
    (0: not known). Under FSDP1 an optimizer that launches at least one kernel per tensor steps them one at a
    time, and its launches and host ops follow the views the rank steps (`views_stepped`); a multi-tensor one
    (foreach, fused) launches per list of tensors, which the shorter lists change by a chunk or two: kept."""
    grad_itemsize = 2 if precision.endswith("-pure") else 4
    units = blocks + 1
    elements = grad_bytes / grad_itemsize
    out = costs.scaled(1.0)
    micro_steps = max(1, micro_steps)
    every = split.sync_every_micro_step or micro_steps == 1
    kinds = ([(True, False)] + [(True, True)] * (micro_steps - 1) if every else
             [(False, False)] * (micro_steps - 1) + [(True, False)])
    step_phases = [phase for phase in out.kernels if phase not in ("forward", "backward")]
    if split.flat_params and tensors > 0 and sum(out.kernels[p] for p in step_phases) >= tensors:
        share = views_stepped(tensors, units, split.shards) / tensors
        for phase in step_phases:
            out.kernels[phase] *= share
        for phase in out.host_ops:
            if phase not in ("forward", "backward"):
                out.host_ops[phase] *= share
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
