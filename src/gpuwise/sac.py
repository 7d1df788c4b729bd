"""Selective activation checkpointing as torchtitan runs it ("per-op SAC", `--activation_checkpoint.mode
selective --activation_checkpoint.selective_ac_option op`).

torchtitan (torchtitan/models/llama3/infra/parallelize.py, `_apply_ac_to_transformer_block`) wraps each
transformer block in `torch.utils.checkpoint` with `create_selective_checkpoint_contexts(policy)`: the
outputs of the ops in `_save_list` are kept, every other op is recomputed in backward, and of the matmuls
only every second one is kept ("Saves output of all compute ops, except every second mm"). The same list
and rule are used here, so `--checkpointing selective` traces what such a run keeps.
"""

from __future__ import annotations

from collections import defaultdict


def _save_list() -> set:
    import torch

    ops = [torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_efficient_attention.default,
           torch.ops.aten._scaled_dot_product_flash_attention.default,
           # for low precision training, torchtitan always saves the result of max
           torch.ops.aten.max.default]
    c10d = getattr(torch.ops, "_c10d_functional", None)
    if c10d is not None and hasattr(c10d, "reduce_scatter_tensor"):
        ops.append(c10d.reduce_scatter_tensor.default)
    cudnn = getattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention", None)
    if cudnn is not None:  # torchtitan adds it where torch has it
        ops.append(cudnn.default)
    return set(ops)


def selective_context_fn():
    """A `context_fn` for `torch.utils.checkpoint.checkpoint` applying torchtitan's per-op policy."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    save = _save_list()
    counts: dict[str, int] = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == torch.ops.aten.mm.default:
            counts[mode] += 1
        keep = func in save and not (func == torch.ops.aten.mm.default and counts[mode] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)
