"""`gpuwise watch -- cmd`: run a training command, sample its GPUs and CPU, explain what held it back."""

from __future__ import annotations

import os

from ..errors import GpuwiseError
from ..monitoring.external import watch_command
from ..plan.hint import planner_max_batch
from ..report import console
from ..report.html import write_html
from ..report.monitor import render_summary
from .common import add_command_argument, command_from_args

HELP = "run a training command, watch its GPUs and CPU, and explain low or oscillating GPU utilisation"
EXAMPLES = """\
  gpuwise watch -- python train.py --epochs 1
  gpuwise watch --report run.html --interval 0.2 -- torchrun --nproc-per-node 2 train.py
  gpuwise watch --json -- python train.py          # the command's stdout goes to stderr
The command's exit code is passed through. Ctrl-C stops the command and still writes the report.
Scripts that use `gpuwise.monitor` also report the per-step split (data wait / copy / compute).
"""


def add_arguments(p) -> None:
    p.add_argument("--report", metavar="FILE.html", help="write a self-contained HTML report with timeline charts")
    p.add_argument("--interval", type=float, default=0.1, metavar="S", help="sampling interval in seconds (default 0.1)")
    p.add_argument("--steps-dir", metavar="DIR", help="keep the per-step files the command's monitor writes here")
    add_command_argument(p)


def run(args) -> int:
    cmd = command_from_args(args, "gpuwise watch -- python train.py ...")
    if args.report:
        _check_report_path(args.report)  # before the run, not after it
    # With --json our stdout carries exactly one JSON object, so the command's stdout goes to stderr.
    result = watch_command(cmd, interval_s=args.interval, steps_dir=args.steps_dir,
                           stdout=2 if args.json else None)  # fd 2: stderr
    summary = result.summary(planner=planner_max_batch)
    summary["exit_code"] = result.exit_code
    summary["interrupted"] = result.interrupted
    summary["seconds"] = result.seconds
    if args.report:
        write_html(args.report, result.timeline, summary)
    if args.json:
        console.emit_json({**summary, "command": cmd, "report": args.report})
    else:
        render_summary(summary, report_path=args.report)
    return result.exit_code


def _check_report_path(path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise GpuwiseError(f"--report {path!r}: cannot create its folder: {exc.strerror or exc}") from None
    if os.path.isdir(path) or not os.access(folder, os.W_OK):
        raise GpuwiseError(f"--report {path!r}: not a writable file path")
