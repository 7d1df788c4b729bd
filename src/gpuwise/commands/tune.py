"""`gpuwise tune`: the batch size, DataLoader settings and precision with the most samples/s, measured."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import GpuwiseError
from ..report import console
from ..report import tune as report
from ..report.tune_script import print_progress, render
from ..step import OPTIMIZERS, check_precision
from ..tuning import goodput, tune
from ..tuning.script import code_change, run_script_trial, tune_script
from ..units import parse_duration
from ..workload import load_workload
from .common import BATCH_MEANING, add_gpu_argument, positive_int, refuse_gpu_all

HELP = "find the batch size, DataLoader settings and precision that train fastest (measured, resumable)"
TRAILING_COMMAND = True  # `gpuwise tune [options] -- CMD`: cli.main splits the command off first
EXAMPLES = """\
  gpuwise tune --budget 90s -- python train.py --epochs 1   # your own script, unchanged: DataLoader settings
  gpuwise tune examples:imagefolder --budget 5m
  gpuwise tune train_job.py --gpu cuda:0 --results tune.jsonl --plot tune.png
  gpuwise tune examples:resnet --batch-sizes 32,64,128 --json | jq .best
  # killed? run the same command again: finished trials are read back from --results, not repeated
"""


def add_arguments(p) -> None:
    p.add_argument("workload", metavar="WORKLOAD", nargs="?",
                   help="path/to/job.py, pkg.module or examples:NAME; or give your script after `--` instead")
    p.set_defaults(cmd=[])
    p.add_argument("--budget", default="5m", help="time for the whole search, e.g. 90s, 5m (default 5m)")
    p.add_argument("--max-trials", type=positive_int, metavar="N",
                   help="at most N trials (those read back from --results count); the search ends at whichever of "
                        "--budget and --max-trials comes first (a script's winner is re-measured on top)")
    add_gpu_argument(p, on_this_machine=True)
    p.add_argument("--results", help="JSONL file: every trial is appended as it finishes; a rerun resumes from it")
    p.add_argument("--plot", metavar="FILE", help="write a chart (samples/s vs batch size and vs workers) to FILE, as in "
                   "estimate and fit; a folder (the older form, deprecated) still gets one PNG per chart")
    p.add_argument("-b", "--batch-size", type=positive_int, help=BATCH_MEANING + ": the baseline's, and the search's start (default 32)")
    p.add_argument("--batch-sizes", help="comma-separated batch sizes to try instead of the search")
    p.add_argument("--precision", default="fp32", help="the precision as given (baseline; default fp32)")
    p.add_argument("--precisions", help="comma-separated candidates (default: what the device does cheaply)")
    p.add_argument("--optimizer", choices=list(OPTIMIZERS), help="override the workload's optimizer (default: its own, else adamw)")
    p.add_argument("--measure", help="timed part of each trial (default 2s; 3s for a script after `--`)")
    p.add_argument("--max-workers", type=int, help="upper bound for num_workers (default 2 x usable CPUs)")
    p.add_argument("--objective", choices=("throughput", "goodput"), default="throughput",
                   help="throughput: most samples/s (default); goodput: least predicted time to a target loss, "
                        "steps(B) x step_time(B), steps(B) along --reference-path, else S_min (1 + B_noise / B)")
    p.add_argument("--reference-path", metavar="FILE",
                   help="goodput: steps(B) from a reference run's path to the target loss (goodput.ReferencePath "
                        "JSON, e.g. `benchmarks/goodput_validate.py --save-paths DIR`) instead of eq. 2.11 with "
                        "--noise-scale: the steps and the learning rate at each batch")
    p.add_argument("--target-loss", type=float, metavar="LOSS",
                   help="goodput with --reference-path: the target loss (default: the path's own)")
    p.add_argument("--noise-scale", type=float, metavar="B",
                   help="the gradient noise scale B_simple (`gpuwise watch --json` reports it); default for a script: "
                        "measured in one more run of the script as written")
    p.add_argument("--gpus", type=positive_int, default=1, metavar="N",
                   help="GPUs (data-parallel ranks) the recommended batch is split over (goodput; default 1)")


def _ints(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise GpuwiseError(f"--batch-sizes: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise GpuwiseError(f"--batch-sizes: expected positive integers, got {text!r}")
    return values


IMAGE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")  # what matplotlib's Agg backend writes


def _plot_is_folder(path: str) -> bool:
    """`--plot` is a FILE, as in estimate and fit. The older form, a folder for one PNG per chart, still
    works, with a deprecation note on stderr: a path that is a folder or has no image extension. Checked
    before the budget is spent, not after."""
    target = Path(path)
    if target.suffix.lower() in IMAGE_SUFFIXES and not target.is_dir():
        if not target.resolve().parent.is_dir():
            raise GpuwiseError(f"--plot {path}: the folder {target.resolve().parent} does not exist")
        return False
    console.err.print(f"note: --plot {path}: a folder is the older form of --plot and is deprecated; give a file "
                      "(e.g. --plot tune.png) for one chart, as in estimate and fit", markup=False)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise GpuwiseError(f"--plot {path!r}: cannot create the folder: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK):
        raise GpuwiseError(f"--plot {path!r}: the folder is not writable")
    return True


def run(args) -> int:
    refuse_gpu_all(args.device, "tune", "cuda, cuda:N, cpu or auto")
    budget_s = parse_duration(args.budget)
    if (args.reference_path or args.target_loss is not None) and args.objective != "goodput":
        raise GpuwiseError("--reference-path and --target-loss go with --objective goodput")
    _reference_path(args)  # a bad file is one line, before any trial runs
    if args.cmd:
        if args.workload:
            raise GpuwiseError(f"give a WORKLOAD ({args.workload!r}) or a command after `--`, not both")
        return _run_script(args, budget_s)
    if not args.workload:
        raise GpuwiseError("give a WORKLOAD (job.py, examples:NAME) or your script: `gpuwise tune -- python train.py`")
    args.measure = args.measure or "2s"
    precisions = [check_precision(p) for p in args.precisions.split(",")] if args.precisions else None
    load_workload(args.workload).build_batch(1)  # a bad workload is one line, before the progress bar starts
    plot_folder = _plot_is_folder(args.plot) if args.plot else False
    with report.TuneProgress(budget_s) as bar:
        result = tune(args.workload, budget_s=budget_s, device=args.device, results=args.results,
                      batch_sizes=_ints(args.batch_sizes), batch_size=args.batch_size,
                      precision=check_precision(args.precision), precisions=precisions,
                      optimizer=args.optimizer, measure_s=parse_duration(args.measure),
                      max_workers=args.max_workers, max_trials=args.max_trials, on_trial=bar)
    charts = [] if not args.plot else report.plot(result, args.plot) if plot_folder else report.plot_file(result, args.plot)
    text = report.snippet(result)
    advice = _goodput_of_workload(args, result) if args.objective == "goodput" else None
    if args.json:
        d = result.to_dict()
        d["snippet"] = text
        d["charts"] = charts
        if advice is not None:
            d["goodput"] = advice.to_dict()
        console.emit_json(d)
        return 0
    console.out.print(report.summary_table(result))
    console.out.print(report.precision_table(result))
    if args.debug:
        console.out.print(report.trials_table(result))
    bs = f"throughput-optimal batch {result.throughput_batch_size}"
    bs += (f", largest safe batch {result.largest_safe_batch_size}" if result.largest_safe_searched
           else " (largest safe batch not searched: no out-of-memory on this device)")
    console.out.print(bs + (f"; {result.batch_stop_reason}" if result.batch_stop_reason else ""))
    if result.loader_samples_per_s_per_worker:
        console.out.print(f"loader alone, one process: {result.loader_samples_per_s_per_worker:,.0f} samples/s; "
                          f"compute alone: {result.limit_samples_per_s or 0:,.0f} samples/s "
                          f"-> about {result.workers_estimate} worker(s) needed")
    for note in result.notes:
        console.out.print(f"[yellow]note:[/yellow] {note}")
    console.out.print(f"{len(result.trials)} trials ({result.resumed_trials} resumed) in "
                      f"{result.elapsed_s:.0f}s of a {budget_s:.0f}s budget"
                      + (f"; results in {args.results}" if args.results else ""))
    console.out.print("\n" + text)
    for path in charts:
        console.out.print(f"chart: {path}")
    if advice is not None:
        _print_goodput(advice)
    return 0


def _run_script(args, budget_s: float) -> int:
    """`gpuwise tune -- CMD`: the script's own DataLoader, tuned by short trials (tuning/script.py)."""
    for name in ("batch_size", "batch_sizes", "precisions", "optimizer", "plot"):
        if getattr(args, name, None):
            raise GpuwiseError(f"--{name.replace('_', '-')} applies to workload files: a script's batch size, "
                               "precision and optimizer are its own (gpuwise measures them and advises)")
    result = tune_script(args.cmd, budget_s=budget_s, results=args.results,
                         measure_s=parse_duration(args.measure or "3s"), max_workers=args.max_workers,
                         max_trials=args.max_trials, on_trial=print_progress)
    change = code_change(result)
    advice = _goodput_of_script(args, result) if args.objective == "goodput" else None
    if args.json:
        console.emit_json({**result.to_dict(), "code_change": change,
                           **({"goodput": advice.to_dict()} if advice is not None else {})})
    else:
        render(result, change, budget_s, args.results)
        if advice is not None:
            _print_goodput(advice)
    return 0


def _reference_path(args):
    if args.target_loss is not None and not args.reference_path:
        raise GpuwiseError("--target-loss needs --reference-path FILE")
    if not args.reference_path:
        return None
    try:
        return goodput.load_path(args.reference_path)
    except ValueError as exc:
        raise GpuwiseError(f"--reference-path: {exc}") from None


def _goodput_of_workload(args, result):
    path = _reference_path(args)
    if not args.noise_scale and path is None:
        raise GpuwiseError("--objective goodput on a workload needs --noise-scale B: measure it on your training with "
                           "`gpuwise watch --json -- python train.py` (gradient_noise_scale.b_simple), or "
                           "--reference-path FILE")
    try:
        return goodput.from_trials(result.trials, args.noise_scale, result.baseline.batch_size, args.gpus,
                                   args.optimizer or "adamw", path=path, target=args.target_loss)
    except ValueError as exc:
        raise GpuwiseError(f"--objective goodput: {exc}") from None


def _goodput_of_script(args, result):
    base = result.baseline
    measured = {}
    path = _reference_path(args)
    if path is not None:
        if not base.batch_size:
            raise GpuwiseError("--objective goodput: the script's batch size was not seen (no DataLoader)")
        try:
            return goodput.from_path_one_batch(path, base.batch_size, args.gpus, args.target_loss)
        except ValueError as exc:
            raise GpuwiseError(f"--objective goodput: {exc}") from None
    if not args.noise_scale:  # one more run of the script as written, with the noise-scale probe on
        probed = run_script_trial(args.cmd, {}, measure_s=max(parse_duration(args.measure or "3s"), 10.0), noise=True)
        measured = probed.noise_scale or {}
        base.optimizer = base.optimizer or probed.optimizer
    b_noise = args.noise_scale or measured.get("b_simple")
    if not b_noise or b_noise <= 0:
        raise GpuwiseError("--objective goodput: the script's gradient noise scale could not be measured in its trial "
                           "(no torch.optim step or no DataLoader batch size seen); give it with --noise-scale B")
    if not base.batch_size:
        raise GpuwiseError("--objective goodput: the script's batch size was not seen (no DataLoader)")
    advice = goodput.from_one_batch(b_noise, base.batch_size, args.gpus, base.optimizer)
    if not args.noise_scale:
        advice.notes.append(f"B_noise measured in one more run of the script as written: {b_noise:,.0f} (95% CI "
                            f"{measured.get('ci_low') or 0:,.0f} to {measured.get('ci_high') or float('inf'):,.0f}, "
                            f"{measured.get('steps_used')} steps, {measured.get('estimator')}); early in training "
                            "the noise scale is smaller than later: re-measure with `gpuwise watch` on a longer run")
    return advice


def _print_goodput(advice) -> None:
    out = console.out
    now = f" (now {advice.current_batch_size})" if advice.current_batch_size else ""
    model = ("steps(B) along the reference path" if advice.steps_model == "reference_path"
             else f"B_noise {advice.b_noise:,.0f}")
    out.print(f"goodput: batch {advice.batch_size}{now}, {advice.per_gpu_batch_size} per GPU on {advice.n_gpus}; "
              f"{model}" + (f"; predicted time to target x{advice.speedup:.2f} faster"
                            if advice.speedup else ""), markup=False)
    rate = f"{advice.lr:.3g}, " if advice.lr is not None else ""
    out.print(f"learning rate: {rate}x{advice.lr_factor:.2f} ({advice.lr_rule} rule: {advice.lr_rule_why})", markup=False)
    if advice.warmup:
        out.print(f"warm-up: {advice.warmup}", markup=False)
    for note in advice.notes:
        out.print(f"note: {note}", markup=False)
