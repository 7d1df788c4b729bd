"""`gpuwise demo`: the main job on a bundled example, on whatever is here (a GPU if any, else the CPU).

1. devices: list them and pick the freest GPU (or fall back to the CPU);
2. workload: load and check it;
3. plan: predict the step's memory and FLOPs without running it, and the largest batch on a named GPU;
4. measure: run a few real steps on the chosen device and compare with the prediction.
Each stage that is not installed or fails is reported and skipped; the demo never hides an error.
"""

from __future__ import annotations

from ..demo import run_demo
from ..report import console
from ..report.demo import render_demo
from .common import BATCH_MEANING, positive_int

HELP = "run the main job on a bundled example: devices, pick, plan, measure — a short report"
EXAMPLES = """\
  gpuwise demo
  gpuwise demo examples:gpt-mini --batch-size 8 --gpu H100
  gpuwise demo path/to/job.py --json
"""


def add_arguments(p) -> None:
    p.add_argument("workload", nargs="?", default="examples:resnet", help="workload (default examples:resnet)")
    p.add_argument("-b", "--batch-size", type=positive_int, default=32, help=BATCH_MEANING + " (default 32)")
    p.add_argument("--gpu", default="H100", help="GPU to plan for from the catalog (default H100)")
    p.add_argument("--steps", type=positive_int, default=3, help="measured steps (default 3)")
    p.add_argument("--no-measure", action="store_true", help="plan only, run nothing")


def run(args) -> int:
    result = run_demo(args.workload, args.batch_size, gpu=args.gpu, steps=args.steps, measure=not args.no_measure,
                      on_stage=None if args.json else lambda s: console.err.print(f"[dim]… {s}[/dim]"))
    if args.json:
        console.emit_json(result)
    else:
        render_demo(result)
    return 0
