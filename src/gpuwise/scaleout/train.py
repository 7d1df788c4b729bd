"""The built-in DDP training loop for workload files: one process per rank, started by torchrun.

`gpuwise train` starts torchrun for you; these are the command lines it runs (one node, 2 ranks;
two nodes, 8 GPUs each, run on both with NODE_RANK 0 and 1):

    torchrun --standalone --nproc-per-node 2 -m gpuwise.scaleout.worker run.json
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \\
        --rdzv-id job1 --node-rank NODE_RANK -m gpuwise.scaleout.worker run.json

where run.json is a `TrainConfig` as JSON. Each rank: joins the process group (NCCL on GPUs, gloo on
CPUs), builds the model with the same seed, wraps gpuwise's `TrainStep` model in DDP (which averages
the gradients during backward), reads its share of `dataset()` through a DistributedSampler (or
repeats a synthetic `batch()`), resumes from the checkpoint if there is one, and checkpoints every
`checkpoint_every` steps. Rank 0 writes the result for the parent process.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace

from ..hf import hf_workload
from ..plan.tracing.cpu_truth import STEADY_MARK, peak_in_profile
from ..plan.tracing.modes import apply_modes, make_modes
from ..profiling import cpu_memory_profile
from ..step import StepConfig, TrainStep, enable_checkpointing
from ..workload import load_workload
from . import backend, checkpoint, fsdp
from .dataparallel import unwrap_data_parallel

CRASH_ENV = "GPUWISE_TEST_CRASH_AT_STEP"  # tests only: rank GPUWISE_TEST_CRASH_RANK (default 1) exits
CRASH_RANK_ENV = "GPUWISE_TEST_CRASH_RANK"  # at that step on the first attempt, as if it had crashed


@dataclass
class TrainConfig:
    workload: str
    steps: int = 100
    batch_size: int = 32              # per rank
    optimizer: str | None = None
    precision: str = "fp32"
    checkpointing: bool = False
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0         # 0: only at the end (when checkpoint_dir is set)
    seed: int = 0
    num_workers: int = 0
    log_every: int = 0
    result_path: str | None = None
    strategy: str = "ddp"             # scaleout/fsdp.py STRATEGIES
    grad_accum: int = 1               # micro-batches per optimizer step (gradients synced on the last only)
    lora: int | None = None           # LoRA rank (peft, every linear layer), base frozen
    qlora: bool = False               # QLoRA: 4-bit base (bitsandbytes) + LoRA
    seq_len: int | None = None        # hf: / config.json models: tokens per sample (None: hf.DEFAULT_SEQ_LEN)
    target_len: int | None = None     # a sequence-to-sequence LM's tokens per target (None: seq_len)
    measure_peak: bool = False        # each rank's CPU-allocator peak over its second step (the profiler)
    fsdp_param_dtype: str | None = None   # FSDP2 MixedPrecisionPolicy(param_dtype=...) ("bf16"), fsdp / hsdp
    fsdp_reduce_dtype: str | None = None  # ... reduce_dtype ("fp32" when param_dtype is set and this is None)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


@dataclass
class TrainResult:
    world_size: int
    backend: str
    steps: int
    samples_per_s: float
    final_loss: float | None          # None only when rerunning a job finished by an older gpuwise
    checkpoint: str | None
    device: str = "cpu"
    per_rank_batch_size: int = 0
    data: str = "synthetic"           # "dataset" (DistributedSampler) or "synthetic" (batch() repeated)
    resumed_from_step: int = 0
    restarts: int = 0
    steps_this_attempt: list[int] = field(default_factory=list)
    strategy: str = "ddp"
    grad_accum: int = 1
    rank_peak_bytes: list[int] | None = None  # measure_peak: each rank's steady-step CPU-allocator peak

    def to_dict(self) -> dict:
        return asdict(self)


def job_workload(spec: str, seq_len: int | None = None, target_len: int | None = None):
    """The workload file, or the hf: / config.json model at `seq_len` / `target_len` tokens where given."""
    if (seq_len or target_len) and (spec.startswith("hf:") or spec.endswith(".json")):
        return hf_workload(spec, seq_len=seq_len, target_len=target_len)
    return load_workload(spec)


def build_workload(cfg: TrainConfig):
    """The workload file / hf: / config.json model, with LoRA / QLoRA adapters when asked (as estimate does)."""
    workload = job_workload(cfg.workload, cfg.seq_len, cfg.target_len)
    if cfg.lora or cfg.qlora:
        workload = apply_modes(workload, make_modes(lora=cfg.lora, qlora=cfg.qlora), cfg.precision)
    return workload


def build_step(cfg: TrainConfig, device):
    """The workload, and a TrainStep whose model is under DDP or FSDP2 (same init on every rank)."""
    import torch

    workload = build_workload(cfg)
    torch.manual_seed(cfg.seed)
    model = unwrap_data_parallel(workload.build_model())
    step_cfg = StepConfig(optimizer=cfg.optimizer, precision=cfg.precision, checkpointing=cfg.checkpointing)
    if cfg.strategy == "ddp":
        ts = TrainStep(workload, step_cfg, device, model=model)
        ts.model = backend.wrap_ddp(ts.model, device)  # the optimizer already holds the same Parameters
        return workload, ts
    # FSDP2 replaces the parameters with DTensor shards: checkpointing and sharding first, the optimizer after
    if step_cfg.checkpointing:
        enable_checkpointing(model, "selective" if step_cfg.checkpointing == "selective" else "full")
    if cfg.precision == "bf16-pure":
        model = model.to(torch.bfloat16)
    model = fsdp.shard(model.to(device), cfg.strategy, device, cfg.fsdp_param_dtype, cfg.fsdp_reduce_dtype)
    return workload, TrainStep(workload, replace(step_cfg, checkpointing=False), device, model=model)


def accumulated_step(ts: TrainStep, micro_batches: list, strategy: str, on_device: bool):
    """One optimizer step over `micro_batches` (the loss of each / k), gradients synchronised on the last
    micro-batch only (DDP's `no_sync`, FSDP2's `set_requires_gradient_sync(False)`); the mean loss."""
    k = len(micro_batches)
    if k == 1:
        return ts.step(micro_batches[0], on_device=on_device)
    total = 0.0
    for i, batch in enumerate(micro_batches):
        last = i == k - 1
        if strategy == "ddp":
            sync = contextlib.nullcontext() if last else ts.model.no_sync()
        else:
            ts.model.set_requires_gradient_sync(last)
            sync = contextlib.nullcontext()
        if not on_device:
            batch = ts.to_device(batch)
        with sync, ts.autocast():
            loss = ts.workload.compute_loss(ts.model, batch) / k
        with sync:
            (ts.scaler.scale(loss) if ts.scaler is not None else loss).backward()
        total = total + loss.detach()
    if ts.scaler is not None:
        ts.scaler.step(ts.optimizer)
        ts.scaler.update()
    else:
        ts.optimizer.step()
    ts.optimizer.zero_grad(set_to_none=True)
    return total


def make_loader(workload, cfg: TrainConfig, rank: int, world: int, device):
    """DataLoader over dataset() with a DistributedSampler: rank r reads every world-th sample of the
    epoch's shuffled order, so the ranks together cover the dataset once per epoch."""
    from torch.utils.data import DataLoader, DistributedSampler

    ds = workload.build_dataset()
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=cfg.seed, drop_last=True)
    loader = DataLoader(ds, batch_size=cfg.batch_size, sampler=sampler, drop_last=True, num_workers=cfg.num_workers,
                        collate_fn=workload.collate_fn, pin_memory=device.type == "cuda")
    if len(loader) == 0:
        raise ValueError(f"dataset() has {len(ds)} samples: too few for {world} ranks x batch {cfg.batch_size}")
    return loader, sampler


def batches_from(loader, sampler, start_step: int):
    """(epoch, batch) forever, starting at the batch after `start_step` steps (resuming mid-epoch)."""
    epoch, skip = divmod(start_step, len(loader))
    while True:
        sampler.set_epoch(epoch)
        for batch in itertools.islice(loader, skip, None):
            yield epoch, batch
        epoch, skip = epoch + 1, 0


def train(cfg: TrainConfig) -> TrainResult:
    import torch

    device = backend.worker_device()
    backend_name = backend.init(device)
    rank, world = backend.rank(), backend.world_size()
    profiling = _peak_profile() if cfg.measure_peak else None  # from before the model: every live byte
    workload, ts = build_step(cfg, device)

    # data: the rank's share of dataset(), or one synthetic batch per rank (different on each rank)
    start_step = 0
    ckpt = checkpoint.load(cfg.checkpoint_dir, map_location=device)
    if ckpt is not None:
        fsdp.load_full_state(ts.model, ts.optimizer, cfg.strategy, ckpt.model, ckpt.optimizer)
        if ts.scaler is not None and ckpt.scaler:
            ts.scaler.load_state_dict(ckpt.scaler)
        start_step = ckpt.step
    torch.manual_seed(cfg.seed + 1 + rank)  # from here on each rank draws its own numbers (dropout, data)
    if workload.has_dataset:
        loader, sampler = make_loader(workload, cfg, rank, world, device)
        batches = batches_from(loader, sampler, start_step * cfg.grad_accum)
    else:
        synthetic = ts.to_device(workload.build_batch(cfg.batch_size))
        batches = itertools.repeat((0, synthetic))
    if ckpt is not None and ckpt.world_size == world:
        checkpoint.set_rng_state(ckpt.rng[rank])
    if rank == 0 and ckpt is not None:
        print(f"[gpuwise train] resuming from step {start_step} ({checkpoint.checkpoint_path(cfg.checkpoint_dir)})",
              file=sys.stderr, flush=True)

    crash_at = int(os.environ.get(CRASH_ENV, "-1"))
    crash_rank = int(os.environ.get(CRASH_RANK_ENV, "1"))
    loss = None
    done_this_attempt: list[int] = []
    t0 = None
    path = None
    peak = None
    for step in range(start_step, cfg.steps):
        if step == crash_at and rank == crash_rank and backend.restart_count() == 0:
            os._exit(17)  # tests: a rank dies mid-run without cleaning up
        micro = [next(batches) for _ in range(cfg.grad_accum)]
        epoch = micro[-1][0]
        steady = profiling is not None and len(done_this_attempt) == 1
        with _steady_mark() if steady else contextlib.nullcontext():
            # DDP averages gradients in backward, FSDP reduce-scatters them
            loss = accumulated_step(ts, [b for _, b in micro], cfg.strategy, on_device=not workload.has_dataset)
        if steady:
            peak = _end_peak_profile(profiling)
            profiling = None
        done = step + 1
        done_this_attempt.append(done)
        if t0 is None:  # the first step of an attempt is warm-up (allocations, bucket rebuild)
            backend.synchronize(device)
            t0 = time.perf_counter()
        if cfg.log_every and done % cfg.log_every == 0 and rank == 0:
            print(f"[gpuwise train] step {done}/{cfg.steps} loss {loss.item():.4f}", file=sys.stderr, flush=True)
        if cfg.checkpoint_dir and ((cfg.checkpoint_every and done % cfg.checkpoint_every == 0) or done == cfg.steps):
            rngs = backend.gather(checkpoint.rng_state())  # collective: every rank at the same step
            mean_loss = backend.mean(float(loss), device)
            model_state, optimizer_state = fsdp.full_state(ts.model, ts.optimizer, cfg.strategy)  # FSDP: collective
            if rank == 0:
                path = checkpoint.save(cfg.checkpoint_dir, checkpoint.Checkpoint(
                    step=done, epoch=epoch, model=model_state, optimizer=optimizer_state,
                    scaler=ts.scaler.state_dict() if ts.scaler is not None else None, rng=rngs,
                    world_size=world, meta={"workload": cfg.workload, "per_rank_batch_size": cfg.batch_size,
                                            "loss": mean_loss}))
            backend.barrier()  # no rank moves on (or dies) while rank 0 is still writing
    if profiling is not None:  # fewer than two steps ran: no steady step to report
        _end_peak_profile(profiling, steady=False)
    peaks = backend.gather(peak) if cfg.measure_peak else None
    backend.synchronize(device)
    elapsed = time.perf_counter() - t0 if t0 is not None else 0.0
    timed_steps = max(len(done_this_attempt) - 1, 0)
    if done_this_attempt:
        final_loss = backend.mean(float(loss), device)
    else:  # the checkpoint already had every step (a finished job rerun): its loss, not a made-up 0
        final_loss = ckpt.meta.get("loss") if ckpt is not None else None
    result = TrainResult(
        world_size=world, backend=backend_name, steps=cfg.steps,
        samples_per_s=timed_steps * cfg.batch_size * cfg.grad_accum * world / elapsed if elapsed > 0 else 0.0,
        final_loss=final_loss, checkpoint=path or (checkpoint.checkpoint_path(cfg.checkpoint_dir) if ckpt else None),
        device=device.type, per_rank_batch_size=cfg.batch_size,
        data="dataset" if workload.has_dataset else "synthetic", resumed_from_step=start_step,
        restarts=backend.restart_count(), steps_this_attempt=done_this_attempt, strategy=cfg.strategy,
        grad_accum=cfg.grad_accum, rank_peak_bytes=peaks)
    if rank == 0 and cfg.result_path:
        write_json_atomic(cfg.result_path, result.to_dict())
    backend.shutdown()
    return result


def _peak_profile():
    """The CPU allocator's profile (plan/tracing/cpu_truth.py's truth), entered: every allocation from here,
    and every free, on whichever thread (gloo's workers drop the last reference to collective buffers)."""
    cm = cpu_memory_profile(all_threads=True)
    return cm, cm.__enter__()


def _steady_mark():
    from torch.profiler import record_function

    return record_function(STEADY_MARK)


def _end_peak_profile(profiling, steady: bool = True) -> int | None:
    """Stop the profile; the steady step's peak of CPU-allocator bytes (None without a steady step)."""
    cm, prof = profiling
    cm.__exit__(None, None, None)
    return peak_in_profile(prof, totals=True).peak_bytes if steady else None


def write_json_atomic(path: str, obj: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(obj, fh)
    os.replace(tmp, path)
