"""`gpuwise measure`: run real training steps in a child process and report what they used."""

from __future__ import annotations

from ..devices.torch_device import resolve_device
from ..errors import GpuwiseError
from ..measuring import find_max_batch, measure, snapshot
from ..plan.memory.events import live_peak
from ..report import console
from ..report.measure import maxbatch_table, measurement_table, oom_message
from ..report.progress import ProgressPrinter
from ..workload import load_workload
from .common import (
    add_gpu_argument,
    add_workload_arguments,
    positive_int,
    refuse_gpu_all,
    step_config_from_args,
)

HELP = "run real steps on a device (in a child process, OOM-safe): peak memory, device memory, step time"
EXAMPLES = """\
  gpuwise measure examples:mlp --batch-size 8 --device cpu
  gpuwise measure examples:gpt-mini -b 16 --precision bf16 --optimizer adamw --json
  gpuwise measure train_job.py -b 64 --device cuda:1 --snapshot step.pickle   # view at pytorch.org/memory_viz
  gpuwise measure examples:resnet --max-batch --device cuda                 # the true largest batch
exit codes: 0 measured, 3 out of memory, 2 bad input or a failing workload
"""

OOM_EXIT = 3


def add_arguments(p) -> None:
    add_workload_arguments(p)
    p.add_argument("--steps", type=positive_int, default=10, help="measured steady-state steps (default 10)")
    p.add_argument("--warmup", type=positive_int, default=2, help="warm-up steps before measuring (default 2)")
    add_gpu_argument(p, on_this_machine=True)
    p.add_argument("--snapshot", metavar="FILE", help="save a CUDA memory snapshot of the run (cuda only)")
    p.add_argument("--max-batch", action="store_true",
                   help="find the largest batch that runs, by isolated trials (from --batch-size, default 1)")
    p.add_argument("--seed", type=positive_int,
                   help="with --max-batch: a predicted max batch to confirm (e.g. from `gpuwise estimate`)")
    p.add_argument("--limit", type=positive_int, help="with --max-batch: never try a batch above this")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before a child run is killed (default 1800)")


def run(args) -> int:
    refuse_gpu_all(args.device, "measure", "cuda, cuda:N, cpu or auto")
    config = step_config_from_args(args)
    if args.max_batch:
        return _max_batch(args, config, find_max_batch, resolve_device, maxbatch_table)
    if args.batch_size is None:
        raise GpuwiseError("measure needs --batch-size N (or --max-batch to search for the largest)")
    load_workload(args.workload)  # bad input fails here, in one line, before any progress is shown
    resolve_device(args.device)
    if not args.json:
        console.err.print(f"[dim]… measuring {args.workload} at batch {args.batch_size} in a child process[/dim]")
    m = measure(args.workload, args.batch_size, optimizer=config.optimizer, precision=config.precision,
                checkpointing=config.checkpointing, steps=args.steps, warmup=args.warmup, device=args.device,
                snapshot=args.snapshot, timeout_s=args.timeout, on_progress=ProgressPrinter("measure"))
    events = _snapshot_summary(m.snapshot) if m.snapshot else None
    if args.json:
        console.emit_json({**m.to_dict(), **({"snapshot_events": events} if events else {})})
    elif m.oom:
        console.err.print(oom_message(m))
    else:
        console.out.print(measurement_table(m))
        if events:
            console.out.print(f"snapshot: {events.get('events', 0)} alloc/free events; steady-step peak of live "
                              f"tensors {events.get('steady_peak_bytes')} B (max_memory_allocated "
                              f"{m.peak_allocated_bytes} B) {events.get('error', '')}", markup=False)
    if m.oom:
        if args.json:
            console.err.print(f"gpuwise measure: {m.error}", markup=False)
        return OOM_EXIT
    return 0


def _snapshot_summary(path: str) -> dict:
    """The saved snapshot in the plan's event shape: event count and steady-step peak (a cross-check)."""
    try:
        trace = snapshot.to_trace(snapshot.load(path))
        peak = live_peak(trace)
    except Exception as exc:  # noqa: BLE001 - the measurement stands even if the conversion cannot
        return {"error": f"(could not convert the snapshot: {type(exc).__name__}: {exc})"}
    return {"events": len(trace.events), "steady_start": trace.steady_start,
            "steady_peak_bytes": peak.allocated_bytes, "peak_phase": peak.phase, "by_category": peak.by_category}


def _max_batch(args, config, find_max_batch, resolve_device, maxbatch_table) -> int:
    device = resolve_device(args.device)
    show = None if args.json else (lambda t: console.err.print(f"[dim]… batch {t.batch_size}: {t.status} "
                                                               f"({t.seconds:.1f}s)[/dim]"))
    res = find_max_batch(args.workload, optimizer=config.optimizer, precision=config.precision,
                         checkpointing=config.checkpointing, device=device, start=args.batch_size,
                         seed=args.seed, limit=args.limit, timeout_s=args.timeout, on_trial=show)
    best = res.values.get(res.max_batch_size) if res.max_batch_size is not None else None
    if args.json:
        console.emit_json({"workload": args.workload, "device": device, "optimizer": config.optimizer,
                           "precision": config.precision, "checkpointing": config.checkpointing,
                           **res.to_dict(), "measurement": best})
    else:
        console.out.print(maxbatch_table(res, f"Largest batch of {args.workload} on {device}"))
    if res.error:
        raise GpuwiseError(f"max-batch search stopped: {res.error}")
    return 0 if res.max_batch_size is not None else OOM_EXIT
