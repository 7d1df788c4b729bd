"""`gpuwise scale WORKLOAD -n 1,2,4`: measured samples/s and scaling efficiency, and why."""

from __future__ import annotations

import argparse

from ..devices import discover
from ..plan.speed.comm import LINKS
from ..report import console
from ..report import scale as scale_report
from ..report.progress import ProgressPrinter
from ..scaleout.preflight import preflight
from ..scaleout.scale import ScaleConfig, fit_cpu_ranks, measure_scaling, usable_cores
from .common import (
    add_gpu_selection_arguments,
    add_workload_arguments,
    positive_int,
    step_config_from_args,
    workload_from_args,
)

HELP = "measure DDP scaling over 1, 2, 4... ranks: samples/s, efficiency, compute vs communication per step"
EXAMPLES = """\
  gpuwise scale examples:gpt-mini -n 1,2,4,8 --batch-size 16
  gpuwise scale job.py -n 1,2 --steps 20 --json
The per-rank batch is held constant (global batch = N x batch size); 1 rank is always measured as the
reference. Each point is a separate torchrun job on GPUs picked for it (CPU ranks with gloo without GPUs).
"""


def nproc_list(text: str) -> list[int]:
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a list of rank counts like 1,2,4, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive rank counts like 1,2,4, got {text!r}")
    return values


def add_arguments(p) -> None:
    add_workload_arguments(p)
    p.add_argument("-n", "--nproc", type=nproc_list, default=[1, 2], help="rank counts to measure (default 1,2)")
    p.add_argument("--steps", type=positive_int, default=None,
                   help=f"timed steps of each kind per size (default {GPU_DEFAULTS['steps']}; "
                        f"{CPU_DEFAULTS['steps']} on CPU ranks)")
    p.add_argument("--warmup", type=int, default=None,
                   help=f"untimed steps first (default {GPU_DEFAULTS['warmup']}; {CPU_DEFAULTS['warmup']} on CPU ranks)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="auto: GPUs when there are any, else CPU ranks (gloo)")
    p.add_argument("--oversubscribe", action="store_true",
                   help="CPU ranks: keep rank counts above the number of cores (timings then measure contention)")
    p.add_argument("--link", choices=sorted(LINKS), default=None,
                   help="the link between ranks for the predicted efficiency (default: gloo over loopback for CPU "
                        "ranks, an assumption; pcie4 for GPUs)")
    add_gpu_selection_arguments(p, per_gpu=True)


# Defaults gpuwise chooses when the user gives none. CPU ranks run one thread each (scaleout/scale.py), so
# a GPU-sized batch of gpt-mini took minutes per point on a 2-core machine (issue 14); these end in about
# a minute for the examples there.
GPU_DEFAULTS = {"batch_size": 32, "steps": 10, "warmup": 3}
CPU_DEFAULTS = {"batch_size": 4, "steps": 4, "warmup": 1}


def _on_cpu(device: str) -> bool:
    if device == "cpu":
        return True
    if device == "cuda":
        return False
    found = discover()
    return not (found and found.gpus)


def run(args) -> int:
    workload = workload_from_args(args)
    step_cfg = step_config_from_args(args)
    check = preflight(workload, step_cfg.optimizer)
    if check.data_parallel:
        console.err.print(f"[yellow]note:[/yellow] {check.data_parallel} (gpuwise scale unwraps it)")
    on_cpu = _on_cpu(args.device)
    nprocs = args.nproc
    if on_cpu and not args.oversubscribe:
        cores = usable_cores()
        nprocs, dropped = fit_cpu_ranks(nprocs, cores)
        if dropped:
            console.err.print(f"gpuwise scale: dropped {','.join(map(str, dropped))} rank(s): this machine has "
                              f"{cores} core(s) and each gloo rank needs its own; on shared cores the timing "
                              "measures contention, not scaling (--oversubscribe keeps them)", markup=False, soft_wrap=True)
    defaults = CPU_DEFAULTS if on_cpu else GPU_DEFAULTS
    given = {"batch_size": args.batch_size, "steps": args.steps, "warmup": args.warmup}
    chosen = {k: defaults[k] for k, v in given.items() if v is None}
    if chosen and on_cpu:
        flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in chosen.items())
        console.err.print(f"gpuwise scale: CPU ranks, so small defaults: {flags} (give them to change)", markup=False,
                          soft_wrap=True)
    values = {**given, **chosen}
    cfg = ScaleConfig(workload=args.workload, batch_size=values["batch_size"], steps=values["steps"],
                      warmup=values["warmup"], optimizer=step_cfg.optimizer, precision=step_cfg.precision,
                      checkpointing=step_cfg.checkpointing)

    def done(timing) -> None:
        console.err.print(f"[dim]gpuwise scale: {timing.nproc} rank(s) on {timing.device} ({timing.backend}): "
                          f"step {timing.step_s * 1e3:.1f} ms, compute {timing.compute_s * 1e3:.1f} ms[/dim]")

    result = measure_scaling(cfg, nprocs, device=args.device, on_point=done, on_progress=ProgressPrinter("scale"),
                             link=args.link,
                             min_free=args.min_free,
                             max_util=args.max_util, wait=args.wait)
    memory = check.memory_plan(max(p.nproc for p in result.points))
    if args.json:
        console.emit_json({**result.to_dict(), "optimizer": check.optimizer, "memory_plan": memory.to_dict()})
    else:
        console.out.print(scale_report.scale_table(result))
        for line in scale_report.explain(result):
            console.out.print(line)
        console.out.print(scale_report.memory_table(memory, check.optimizer))
    return 0
