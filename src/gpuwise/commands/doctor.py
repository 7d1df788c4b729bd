"""`gpuwise doctor`: why PyTorch sees no GPU, or a slow one — each check with its evidence and fix."""

from __future__ import annotations

from ..doctor import EXIT_NO_GPU, EXIT_OK, EXIT_PROBLEM, doctor
from ..report import console
from ..report.doctor import checks_table, fix_lines, mapping_table, skipped_line

HELP = "check why PyTorch sees no GPU or a slow one (build, driver, visibility, MIG, ECC, PCIe, clocks, heat)"
EXAMPLES = f"""\
  gpuwise doctor
  gpuwise doctor --expect-gpu          # in a GPU job's preamble: fails unless PyTorch can use a GPU
  gpuwise doctor --json | jq '.checks[] | select(.status != "ok")'
  CUDA_VISIBLE_DEVICES=0,4 gpuwise doctor   # which nvidia-smi GPU becomes cuda:0 and cuda:1
exit codes: {EXIT_OK} nothing wrong (warnings allowed), {EXIT_PROBLEM} a problem found, {EXIT_NO_GPU} --expect-gpu and PyTorch
cannot use a GPU, 2 bad arguments.
"""


def add_arguments(p) -> None:
    p.add_argument("--expect-gpu", action="store_true",
                   help=f"a GPU job: exit {EXIT_NO_GPU} unless PyTorch can use at least one GPU")
    p.add_argument("--max-temp", type=float, metavar="C", default=None,
                   help="warn when a GPU is at or above this temperature in °C (your own limit, e.g. 80)")
    p.add_argument("--no-torch", action="store_true",
                   help="skip the PyTorch checks (they import torch in a child process: a few seconds)")


def run(args) -> int:
    report = doctor(expect_gpu=args.expect_gpu, max_temperature_c=args.max_temp, probe_torch=not args.no_torch)
    if args.json:
        console.emit_json(report.to_dict())
        return report.exit_code
    console.out.print(checks_table(report.checks))
    for c in report.checks:
        table = mapping_table(c)
        if table is not None:
            console.out.print(table)
    fixes = fix_lines(report.checks)
    if fixes:
        console.out.print("fixes:")
        for line in fixes:
            console.out.print(f"  {line}")
    line = skipped_line(report.checks)
    if line:
        console.out.print(f"[dim]{line}[/dim]")
    cpu = {True: "", False: " for a CPU job (PyTorch uses the CPU)", None: " (PyTorch not checked)"}[report.gpu_usable]
    verdict = {EXIT_OK: "nothing wrong" + cpu,
               EXIT_PROBLEM: "problems found: fix them top to bottom",
               EXIT_NO_GPU: "a GPU was expected and PyTorch cannot use one"}[report.exit_code]
    console.out.print(f"exit {report.exit_code}: {verdict}")
    return report.exit_code
