"""The data-parallel strategies `gpuwise train --strategy` runs, one function each way in and out.

    ddp           DistributedDataParallel: every rank holds the whole model, gradients all-reduced
    fsdp          FSDP2 `fully_shard` (ZeRO-3): parameters, gradients and optimizer state sharded over the
                  ranks, each block's parameters all-gathered for its forward and again for its backward
    fsdp-grad-op  `fully_shard(reshard_after_forward=False)` (ZeRO-2 style, FSDP1's SHARD_GRAD_OP): a block's
                  gathered parameters stay from forward to backward (one all-gather per step, more memory)
    hsdp          `fully_shard` on a 2-D mesh (replicate across nodes, shard within a node: LOCAL_WORLD_SIZE)

FSDP2 (torch.distributed.fsdp.fully_shard, docs.pytorch.org/docs/stable/distributed.fsdp.fully_shard.html)
is applied bottom-up as torchtitan does: to each block of the model's largest ModuleList (the transformer
layers; an encoder-decoder's two stacks), then to the root. It replaces the parameters with DTensors, so the optimizer is built afterwards.
Checkpoints hold the full (unsharded) state: `torch.distributed.checkpoint.state_dict`'s
`get_model_state_dict(full_state_dict=True)` gathers it (every rank calls it), `set_model_state_dict`
shards it back on load, so a checkpoint restarts under any strategy or world size.
"""

from __future__ import annotations

import os

from ..errors import GpuwiseError
from ..plan.memory.fsdp_units import block_lists

STRATEGIES = ("ddp", "fsdp", "fsdp-grad-op", "hsdp")


def check_strategy(name: str) -> str:
    if name not in STRATEGIES:
        raise GpuwiseError(f"--strategy must be one of {', '.join(STRATEGIES)}, got {name!r}")
    return name


def blocks(model) -> list:
    """The repeated blocks to shard one by one: the children of the model's largest ModuleList, and of an
    encoder-decoder's other stack (plan/memory/fsdp_units.py `block_lists`, which the plan sizes)."""
    return [block for _, blocks_ in block_lists(model) for block in blocks_]


def mesh_for(strategy: str, device):
    """The device mesh: 1-D over every rank, or (replicate = nodes, shard = ranks per node) for hsdp."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if strategy != "hsdp":
        return init_device_mesh(device.type, (world,))
    local = int(os.environ.get("LOCAL_WORLD_SIZE") or world)
    if world % local:
        local = world
    return init_device_mesh(device.type, (world // local, local), mesh_dim_names=("replicate", "shard"))


DTYPES = {"bf16": "bfloat16", "fp32": "float32"}


def shard(model, strategy: str, device, param_dtype: str | None = None, reduce_dtype: str | None = None):
    """`model` (already on `device`) under FSDP2 for fsdp / fsdp-grad-op / hsdp; returns the root.
    `param_dtype` / `reduce_dtype` ("bf16", "fp32"): a MixedPrecisionPolicy (torchtitan's: bf16 / fp32)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = mesh_for(strategy, device)
    reshard = strategy != "fsdp-grad-op"
    kw = {}
    if param_dtype is not None:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=getattr(torch, DTYPES[param_dtype]),
                                               reduce_dtype=getattr(torch, DTYPES[reduce_dtype or "fp32"]))
    for block in blocks(model):
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard, **kw)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, **kw)
    return model


def inner(model):
    """The user's module: DDP's `.module`, FSDP2's root itself."""
    return getattr(model, "module", model)


def full_state(model, optimizer, strategy: str) -> tuple[dict, dict]:
    """(model, optimizer) state dicts as one process would hold them. A collective under FSDP: every rank."""
    if strategy == "ddp":
        return inner(model).state_dict(), optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return (get_model_state_dict(model, options=opts),
            get_optimizer_state_dict(model, optimizer, options=opts))


def load_full_state(model, optimizer, strategy: str, model_state: dict, optimizer_state: dict) -> None:
    """The inverse of `full_state` (every rank, with the same full state dicts)."""
    if strategy == "ddp":
        inner(model).load_state_dict(model_state)
        optimizer.load_state_dict(optimizer_state)
        return
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_state, options=opts)
    set_optimizer_state_dict(model, optimizer, optimizer_state, options=opts)
