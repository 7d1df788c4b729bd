"""`gpuwise train WORKLOAD -n N`: the built-in DDP training loop under torchrun, with checkpoints."""

from __future__ import annotations

import os

from ..errors import GpuwiseError
from ..report import console
from ..report import scale as scale_report
from ..scaleout.fsdp import STRATEGIES
from ..scaleout.job import WORKER, require_result, run_job
from ..scaleout.preflight import preflight
from ..scaleout.train import TrainConfig, job_workload
from .common import add_workload_arguments, positive_int, step_config_from_args
from .launch import add_launch_arguments, launch_kwargs, write_sbatch

HELP = "train a workload with DDP or FSDP2 on N GPUs (or N CPU ranks), resumable from checkpoints"
EXAMPLES = """\
  gpuwise train examples:mlp -n 2 --steps 200 --batch-size 64
  gpuwise train job.py -n 4 --precision bf16 --checkpoint-dir ckpt --checkpoint-every 100 --max-restarts 3
  gpuwise train examples:gpt-mini -n 8 --plan      # per-rank memory under DDP / ZeRO / FSDP, no training
  gpuwise train llama.json -n 8 --strategy fsdp --precision bf16 --checkpointing --grad-accum 4 -b 2
  gpuwise train hf:meta-llama/Llama-3.2-1B -n 2 --lora 16 --seq-len 1024 -b 4
--batch-size is per rank: the global batch is N x batch size (scale the learning rate with it).
With --checkpoint-dir the job resumes from the last checkpoint there when restarted (or rerun).
"""


def add_arguments(p) -> None:
    add_workload_arguments(p)
    add_launch_arguments(p)
    p.add_argument("--steps", type=positive_int, default=100, help="optimizer steps in all (default 100)")
    p.add_argument("--checkpoint-dir", default=None, help="folder for checkpoint.pt (resume from it if present)")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (default: at the end)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model init and the data order")
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader workers per rank")
    p.add_argument("--log-every", type=int, default=0, help="rank 0 prints the loss every N steps")
    p.add_argument("--plan", action="store_true", help="show the per-rank DDP/ZeRO/FSDP memory plan and exit")
    p.add_argument("--strategy", choices=list(STRATEGIES), default="ddp",
                   help="ddp (default), fsdp (FSDP2 fully_shard, ZeRO-3), fsdp-grad-op (parameters kept "
                        "gathered from forward to backward), hsdp (replicate across nodes, shard within)")
    p.add_argument("--fsdp-param-dtype", choices=["bf16"], default=None,
                   help="fsdp / hsdp: FSDP2 MixedPrecisionPolicy(param_dtype=...), fp32 shards, no autocast")
    p.add_argument("--fsdp-reduce-dtype", choices=["fp32", "bf16"], default=None,
                   help="with --fsdp-param-dtype: MixedPrecisionPolicy(reduce_dtype=...) (default fp32)")
    p.add_argument("--grad-accum", type=positive_int, default=1, metavar="K",
                   help="micro-batches per optimizer step; gradients are synchronised on the last one only")
    p.add_argument("--lora", type=positive_int, nargs="?", const=16, metavar="RANK",
                   help="LoRA adapters through peft on every linear layer (rank, default 16); base frozen")
    p.add_argument("--qlora", action="store_true", help="QLoRA: 4-bit base weights (bitsandbytes) + LoRA")
    p.add_argument("--seq-len", type=positive_int, default=None, help="hf: / config.json models: tokens per sample")
    p.add_argument("--target-len", type=positive_int, default=None,
                   help="hf: / config.json encoder-decoder models (T5, BART): tokens per target (default: --seq-len)")
    p.add_argument("--measure-peak", action="store_true",
                   help="CPU ranks: each rank's steady-step peak of allocated bytes (the profiler), in the result")


def run(args) -> int:
    workload = job_workload(args.workload, args.seq_len, args.target_len)  # the model the ranks build
    step_cfg = step_config_from_args(args)
    batch = args.batch_size or 32
    check = preflight(workload, step_cfg.optimizer)
    if check.data_parallel:
        console.err.print(f"[yellow]note:[/yellow] {check.data_parallel} (gpuwise train unwraps it)")
    world = (args.nproc or 1) * args.nnodes
    if args.plan:
        plan = check.memory_plan(world)
        if args.json:
            console.emit_json({"workload": args.workload, "optimizer": check.optimizer, **plan.to_dict()})
        else:
            console.out.print(scale_report.memory_table(plan, check.optimizer))
        return 0
    if args.checkpoint_every and not args.checkpoint_dir:
        raise GpuwiseError("--checkpoint-every needs --checkpoint-dir")
    if (args.fsdp_param_dtype or args.fsdp_reduce_dtype) and (args.strategy not in ("fsdp", "hsdp") or not args.fsdp_param_dtype):
        raise GpuwiseError("--fsdp-param-dtype / --fsdp-reduce-dtype: FSDP2's MixedPrecisionPolicy, with --strategy "
                           "fsdp or hsdp (and --fsdp-param-dtype for a reduce dtype)")
    if args.fsdp_param_dtype and args.precision != "fp32":
        raise GpuwiseError(f"--fsdp-param-dtype: the weights stay fp32 and FSDP2 casts them; leave --precision "
                           f"at fp32 (got {args.precision})")
    if args.checkpoint_dir:  # before the ranks train, not at their first save
        try:
            os.makedirs(args.checkpoint_dir, exist_ok=True)
        except OSError as exc:
            raise GpuwiseError(f"--checkpoint-dir {args.checkpoint_dir!r}: {exc.strerror or exc}") from None
        if not os.access(args.checkpoint_dir, os.W_OK):
            raise GpuwiseError(f"--checkpoint-dir {args.checkpoint_dir!r}: the folder is not writable")
    cfg = TrainConfig(workload=args.workload, steps=args.steps, batch_size=batch, optimizer=step_cfg.optimizer,
                      precision=step_cfg.precision, checkpointing=step_cfg.checkpointing,
                      checkpoint_dir=os.path.abspath(args.checkpoint_dir) if args.checkpoint_dir else None, checkpoint_every=args.checkpoint_every, seed=args.seed,
                      num_workers=args.num_workers, log_every=args.log_every, strategy=args.strategy,
                      grad_accum=args.grad_accum, lora=args.lora, qlora=args.qlora, seq_len=args.seq_len,
                      target_len=args.target_len, measure_peak=args.measure_peak,
                      fsdp_param_dtype=args.fsdp_param_dtype,
                      fsdp_reduce_dtype=args.fsdp_reduce_dtype)
    if args.sbatch:
        return _sbatch(args, cfg)
    outcome = run_job("train", cfg, nproc=args.nproc, max_restarts=args.max_restarts, device=args.device,
                      on_plan=lambda p: console.err.print(
                          f"[dim]gpuwise train: {p.world_size} rank(s) on {p.device_type}: {p.command_line()}[/dim]"),
                      **launch_kwargs(args))
    if outcome.exit_code == 0 and outcome.result is None and args.nnodes > 1:
        console.err.print("gpuwise train: done (rank 0 ran on another node and holds the result)")
        if args.json:
            console.emit_json({"workload": args.workload, "result_on_this_node": False, "exit_code": 0})
        return 0
    result = require_result(outcome, "training")
    if args.json:
        console.emit_json({"workload": args.workload, **result})
    else:
        console.out.print(scale_report.train_summary(result))
    return 0


def _sbatch(args, cfg: TrainConfig) -> int:
    """--sbatch FILE: the job (FILE.job.json, the worker's TrainConfig) and a script whose ranks run it; rank 0
    writes the result to FILE.result.json."""
    import json
    from dataclasses import asdict

    base = os.path.abspath(args.sbatch)
    if os.path.exists(cfg.workload):  # a workload file: the nodes read it by its absolute (shared) path
        cfg.workload = os.path.abspath(cfg.workload)
    cfg.result_path = base + ".result.json"
    job_path = base + ".job.json"
    with open(job_path, "w") as fh:
        json.dump({"mode": "train", "config": asdict(cfg)}, fh)
    written = write_sbatch(args, [*WORKER, job_path], "gpuwise-train")
    if args.json:
        console.emit_json({"workload": args.workload, **written, "job": job_path, "result": cfg.result_path})
    return 0
