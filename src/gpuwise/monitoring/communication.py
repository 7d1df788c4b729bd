"""Rules on how ranks share the work: time waiting on collectives, and CPU threads beyond the cores.

Both read what the bootstrap recorded (bootstrap/comm.py): each step's `comm_s` (summed into
`communication_fraction`) and the process's `parallel` facts (threads, cores, ranks on the node, DDP's
bytes per step). Registered into `rules.RULES` on import (summary.py imports this module, as it does health.py).
"""

from __future__ import annotations

from ..units import fmt_bytes, fmt_duration
from .result import Summary
from .rules import Finding, rule


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"

# A step that waits on collectives a quarter of its time runs at <= 75% scaling efficiency: the share at which
# the fixes below (fewer, larger or compressed all-reduces per sample) are worth a code change.
COMMUNICATION_FRACTION = 0.25
RANK_COMM_SPREAD = 0.10  # ranks whose communication shares differ by 10 points: the one waiting least is slow


@rule("communication_bound")
def communication_bound(s: Summary) -> Finding | None:
    frac = s.communication_fraction
    if not _num(frac) or frac < COMMUNICATION_FRACTION:
        return None
    par = s.parallel or {}
    step = (s.step_time_s or {}).get("median")
    comm = ((s.split or {}).get("comm_s") or {}).get("median")
    evidence = f"{_pct(frac)} of step time waits on collectives"
    if _num(comm) and _num(step):
        evidence += f" (median {fmt_duration(comm)} of a {fmt_duration(step)} step)"
    nbytes = par.get("allreduce_bytes_per_step")
    batch = s.batch_size
    if _num(nbytes):
        evidence += f"; DDP all-reduces {fmt_bytes(nbytes)} of gradients per step"
        if _num(batch) and batch:
            evidence += f" for {batch} samples per rank"
    ranks = [r for r in s.ranks or [] if _num(r.get("communication_fraction"))]
    if len(ranks) > 1:
        evidence += "; per rank: " + ", ".join(f"rank {r['rank']} {_pct(r['communication_fraction'])}" for r in ranks)
        least = min(ranks, key=lambda r: r["communication_fraction"])
        most = max(ranks, key=lambda r: r["communication_fraction"])
        if most["communication_fraction"] - least["communication_fraction"] >= RANK_COMM_SPREAD:
            evidence += (f"; rank {least['rank']} is the slowest: it waits least, the others wait for it in the "
                         "collectives")
    if par.get("ddp_models") == 0:  # collectives from Python (FSDP2, the script's own dist.* calls), no DDP
        fixes = [
            "more samples per rank per collective: a larger per-GPU batch, or gradient accumulation that "
            "reduce-scatters on the last micro-batch only (FSDP2: `model.set_requires_gradient_sync(False)` for the "
            "first k-1 of k)",
            "fewer all-gathers: `fully_shard(..., reshard_after_forward=False)` keeps a block's parameters from "
            "forward to backward (more memory), or shard larger units (fewer, larger collectives)",
            "fewer bytes: `MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)` halves "
            "what FSDP sends",
        ]
        if (s.device or "cpu") == "cpu":
            fixes.append("these are CPU ranks (gloo): GPUs with NCCL over NVLink/PCIe move data 10-100x faster")
        return Finding("communication_bound", evidence, "; ".join(fixes))
    fixes = [
        "more samples per rank per all-reduce: a larger per-GPU batch (communication per step stays the same, "
        "compute grows), or gradient accumulation that skips the all-reduce on all but the last micro-batch "
        "(`with model.no_sync(): loss.backward()` for the first k-1 of k)",
        "fewer bytes: `model.register_comm_hook(None, torch.distributed.algorithms.ddp_comm_hooks.default_hooks."
        "bf16_compress_hook)` (fp16_compress_hook on GPUs without bf16) halves what is sent",
        "more overlap: `DistributedDataParallel(model, bucket_cap_mb=...)` (smaller buckets start earlier in "
        "backward, larger ones cost fewer calls; default 25), `gradient_as_bucket_view=True`",
    ]
    if (s.device or "cpu") == "cpu":
        fixes.append("these are CPU ranks (gloo): their reductions run on the cores backward needs; "
                     "GPUs with NCCL over NVLink/PCIe move gradients 10-100x faster")
    return Finding("communication_bound", evidence, "; ".join(fixes))


@rule("oversubscribed_threads")
def oversubscribed_threads(s: Summary) -> Finding | None:
    """torch's intra-op threads of every rank (and one per DataLoader worker) beyond the usable cores: the
    threads wait for each other at every parallel op (a 1.3 ms CPU step took 40 ms with 2 threads on 2 busy
    cores, 1.3 ms with 1; docs/contracts.md)."""
    par = s.parallel or {}
    threads, cores = par.get("torch_threads"), par.get("usable_cores")
    if s.on_gpu or not _num(threads) or not _num(cores) or not cores:
        return None
    procs = par.get("local_world_size") or s.extras.get("world_size") or 1
    workers = (s.loader or {}).get("num_workers") or 0
    wanted = procs * (threads + workers)
    if wanted <= cores:
        return None
    per = max(cores // procs - workers, 1)
    evidence = (f"{procs} process(es) x ({threads} torch intra-op threads"
                + (f" + {workers} DataLoader workers" if workers else "") + f") = {wanted} busy threads on "
                f"{cores} usable cores")
    return Finding("oversubscribed_threads", evidence,
                   f"OMP_NUM_THREADS={per} in the command's environment, or `torch.set_num_threads({per})` at "
                   "the top of the script (torchrun sets OMP_NUM_THREADS=1 unless it is set)")
