"""Communication of a data-parallel step, and how much of it the backward (or forward) hides.

    ddp           all-reduce of the gradients in 25 MiB buckets as backward produces them
                  (DistributedDataParallel bucket_cap_mb=25, torch docs): hidden behind backward except
                  the last bucket, which is reduced after backward ends
    zero1         as ddp, then an all-gather of the updated parameters after the optimizer (exposed)
    zero2         reduce-scatter of the gradients during backward (last bucket exposed), then the
                  all-gather of the updated parameters after the optimizer (DeepSpeed ZeRO-2; exposed)
    fsdp-grad-op  all-gather of each block's parameters in forward, prefetched one block ahead (the first
                  block's is exposed), reduce-scatter of the gradients in backward (the last block's exposed);
                  one collective per block and pass, each paying NCCL's per-call latency
    fsdp / zero3  as fsdp-grad-op plus a second all-gather in backward (FSDP2 reshard_after_forward=True;
                  backward prefetch one block ahead)
    hsdp          fsdp within a node, then an all-reduce of each rank's gradient shard across nodes, issued
                  per block in the same post-backward hook as the reduce-scatter (torch FSDP
                  _post_backward_hook -> _reduce_grad), so it overlaps backward like the reduce-scatter;
                  the ranks of a node share its network (each of the node's shard positions runs its own
                  ring across nodes)
Communication hidden behind compute still costs what exceeds that compute: exposed = max(0, comm -
compute) + the part that cannot overlap (Rajbhandari et al., ZeRO, SC'20, sec. 7 volumes; FSDP2 docs).
And while it overlaps, NCCL's CTAs hold SMs that compute cannot use (comm.nccl_sms): compute of W seconds
beside C seconds of collectives takes W + C x sms / SM count (C <= W): `contention_s`.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import comm

DDP_BUCKET_BYTES = 25 * 2**20
STRATEGIES = ("single", "ddp", "zero1", "zero2", "fsdp", "zero3", "fsdp-grad-op", "hsdp", "pipeline")


@dataclass(frozen=True)
class CommPlan:
    total_s: float     # all collectives of the step, back to back
    exposed_s: float   # what the step waits for
    contention_s: float = 0.0  # compute slowed by the SMs NCCL holds while it overlaps


def comm_time(strategy: str, nproc: int, link: str, grad_bytes: float, param_bytes: float,
              forward_s: float, backward_s: float, blocks: int = 1, gpus_per_node: int = comm.GPUS_PER_NODE,
              network_gbps: float | None = None, sm_count: int = 0, micro_steps: int = 1,
              sync_every: bool = False) -> CommPlan:
    """Collectives per step of one rank under `strategy` on `nproc` ranks. `grad_bytes`: gradients as
    reduced (fp32 for fp32 master weights); `param_bytes`: parameters as gathered (bf16 under mixed
    precision); `blocks`: the FSDP units (transformer blocks) the parameters are split into; `network_gbps`:
    the node-to-node bandwidth of a node as stated (default: one NIC per GPU of the DGX generation);
    `sm_count`: the GPU's SMs, for `contention_s` (0: not counted); `micro_steps`: gradient accumulation's
    micro-batches per step: FSDP frees each unit's gathered parameters after use, so every micro-batch
    gathers them again in forward (and backward); the gradients are reduced once, on the last micro-batch
    (the loops accumulate under no_sync: torch DDP / FSDP1 no_sync, Lightning Fabric's no_backward_sync, FSDP2's
    set_requires_gradient_sync(False), HF accelerate's accumulate(); as the memory model assumes); DDP / ZeRO-1/2
    likewise reduce once per step. `sync_every` (`--accum-sync every`): the gradients are reduced on every
    micro-batch instead (Composer under FSDP: its `ddp_sync_context` / `_train_microbatch` enters `no_sync` only
    for a DDP model; accelerate's sync_each_batch=True): each micro-batch's backward issues its units'
    reduce-scatters (DDP: its buckets' all-reduces) as it produces them, overlapped with that backward, and
    waits for its last one at the end of its backward (FSDP's post-backward final callback waits for the
    reduce stream), so every micro-batch exposes a unit's (a bucket's) reduction."""
    s = "fsdp" if strategy == "zero3" else strategy
    if nproc <= 1 or s in ("single", "pipeline"):
        return CommPlan(0.0, 0.0)
    blocks = max(1, blocks)
    syncs = max(1, micro_steps) if sync_every else 1  # gradient reductions per optimizer step
    shard_ranks = min(nproc, gpus_per_node) if s == "hsdp" else nproc
    share = comm.nccl_sms(link, shard_ranks > gpus_per_node) / sm_count if sm_count else 0.0
    kw = {"gpus_per_node": gpus_per_node}
    if network_gbps:
        kw.update(network=comm.node_network(network_gbps), nics_per_node=1)
    if s in ("ddp", "zero1"):
        ar = syncs * comm.all_reduce_s(grad_bytes, nproc, link, **kw)
        last = syncs * comm.all_reduce_s(min(DDP_BUCKET_BYTES, grad_bytes), nproc, link, **kw)
        exposed = max(0.0, ar - backward_s) + last
        total = ar
        if s == "zero1":
            ag = comm.all_gather_s(param_bytes, nproc, link, **kw)
            total, exposed = total + ag, exposed + ag
        return CommPlan(total, exposed, share * min(ar, backward_s))
    if s == "zero2":
        rs = syncs * comm.reduce_scatter_s(grad_bytes, nproc, link, **kw)
        last = syncs * comm.reduce_scatter_s(min(DDP_BUCKET_BYTES, grad_bytes), nproc, link, **kw)
        ag = comm.all_gather_s(param_bytes, nproc, link, **kw)
        return CommPlan(rs + ag, max(0.0, rs - backward_s) + last + ag, share * min(rs, backward_s))
    micro = max(1, micro_steps)
    # one NCCL call per unit and pass (FSDP gathers / reduces each wrapped block on its own), so each pays
    # the collective's latency: `blocks` calls of a block's bytes, not one call of the model's
    ag = micro * blocks * comm.all_gather_s(param_bytes / blocks, shard_ranks, link, **kw)
    rs = syncs * blocks * comm.reduce_scatter_s(grad_bytes / blocks, shard_ranks, link, **kw)
    across = 0.0
    if s == "hsdp" and nproc > shard_ranks:
        if network_gbps:  # the node's network shared by its shard positions' rings
            net = comm.node_network(network_gbps / shard_ranks)
        else:  # one NIC per GPU: each shard position's ring has its own
            net = comm.get_link(comm.network_for_link(link))
        across = syncs * blocks * comm.all_reduce_s(grad_bytes / shard_ranks / blocks, nproc // shard_ranks, net,
                                            gpus_per_node=1, network=net, nics_per_node=1)
    # each micro-batch waits for its first unit's gather; the step (each micro-batch, syncing every one) for
    # its last unit's reduction
    ag_block, rs_block = ag / blocks, (rs + across) / blocks
    fwd_comm, bwd_comm = ag, rs + across + (ag if s in ("fsdp", "hsdp") else 0.0)
    exposed = max(0.0, fwd_comm - forward_s) + ag_block + max(0.0, bwd_comm - backward_s) + rs_block
    contention = share * (min(fwd_comm, forward_s) + min(bwd_comm, backward_s))
    return CommPlan(fwd_comm + bwd_comm, exposed, contention)
