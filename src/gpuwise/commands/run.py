"""`gpuwise run -- cmd`: pick and reserve GPUs, run the command with CUDA_VISIBLE_DEVICES set."""

from __future__ import annotations

import os
import shlex
import subprocess

from ..devices import pick
from ..errors import GpuwiseError, NoGpuError
from ..process import wait_forwarding_sigint
from ..report import console
from .common import add_command_argument, add_gpu_selection_arguments, command_from_args, positive_int

HELP = "pick and reserve GPU(s) for the life of a command, run it with CUDA_VISIBLE_DEVICES set"
EXAMPLES = """\
  gpuwise run -- python train.py --epochs 10
  gpuwise run -n 2 --min-free 20GiB --wait 30m -- torchrun --nproc-per-node 2 train.py
  gpuwise run --cpu-fallback -- python train.py      # no GPU on this machine: run it on the CPU anyway
The command's exit code is passed through; the GPUs are released when it ends.
"""


def add_arguments(p) -> None:
    p.add_argument("-n", "--count", type=positive_int, default=1, help="how many GPUs (default 1)")
    add_gpu_selection_arguments(p)
    p.add_argument("--uuid", action="store_true", help="set UUIDs instead of indices")
    p.add_argument("--cpu-fallback", action="store_true",
                   help="on a machine with no GPU, run the command on the CPU (CUDA_VISIBLE_DEVICES='') instead of "
                        "refusing; GPUs that exist but are busy still wait or fail")
    add_command_argument(p)


def run(args) -> int:
    cmd = command_from_args(args, "gpuwise run -- python train.py ...")
    try:
        result = pick(args.count, min_free=args.min_free, max_util=args.max_util, wait=args.wait, uuid=args.uuid,
                      reserve_for="process", set_env=False, command=shlex.join(cmd),
                      on_wait=lambda m: console.err.print(f"[dim]waiting: {m}[/dim]"))
    except NoGpuError as exc:
        if not args.cpu_fallback:
            raise GpuwiseError(f"{exc}; `gpuwise run --cpu-fallback -- ...` runs the command on the CPU") from None
        return _run_on_cpu(cmd, str(exc), args.json)
    env = {**os.environ, **result.environment()}
    try:
        proc = subprocess.Popen(cmd, env=env)
    except OSError as exc:
        result.release()
        raise GpuwiseError(f"cannot start {cmd[0]!r}: {exc.strerror}") from exc
    console.err.print(f"[dim]gpuwise run: CUDA_VISIBLE_DEVICES={result.cuda_visible_devices} {shlex.join(cmd)}[/dim]")
    try:
        code = wait_forwarding_sigint(proc)  # keep the GPUs until the command has shut down
    finally:
        result.release()
    if args.json:
        console.emit_json({**result.to_dict(), "command": cmd, "exit_code": code})
    return code


def _run_on_cpu(cmd: list[str], why: str, as_json: bool) -> int:
    """--cpu-fallback on a machine without GPUs: the command runs with no GPU visible."""
    console.err.print(f"[yellow]gpuwise run: {why}: running on the CPU[/yellow] {shlex.join(cmd)}", markup=True)
    try:
        proc = subprocess.Popen(cmd, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    except OSError as exc:
        raise GpuwiseError(f"cannot start {cmd[0]!r}: {exc.strerror}") from exc
    code = wait_forwarding_sigint(proc)
    if as_json:
        console.emit_json({"devices": [], "cuda_visible_devices": "", "cpu_fallback": True, "command": cmd,
                           "exit_code": code})
    return code
