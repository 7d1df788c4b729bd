"""`gpuwise run -- cmd`: pick and reserve GPUs, run the command with CUDA_VISIBLE_DEVICES set."""

from __future__ import annotations

import os
import shlex
import subprocess

from ..devices import pick
from ..errors import GpuwiseError
from ..process import wait_forwarding_sigint
from ..report import console
from .common import add_command_argument, add_gpu_selection_arguments, command_from_args, positive_int

HELP = "pick and reserve GPU(s) for the life of a command, run it with CUDA_VISIBLE_DEVICES set"
EXAMPLES = """\
  gpuwise run -- python train.py --epochs 10
  gpuwise run -n 2 --min-free 20GiB --wait 30m -- torchrun --nproc-per-node 2 train.py
The command's exit code is passed through; the GPUs are released when it ends.
"""


def add_arguments(p) -> None:
    p.add_argument("-n", "--count", type=positive_int, default=1, help="how many GPUs (default 1)")
    add_gpu_selection_arguments(p)
    p.add_argument("--uuid", action="store_true", help="set UUIDs instead of indices")
    add_command_argument(p)


def run(args) -> int:
    cmd = command_from_args(args, "gpuwise run -- python train.py ...")
    result = pick(args.count, min_free=args.min_free, max_util=args.max_util, wait=args.wait, uuid=args.uuid,
                  reserve_for="process", set_env=False, command=shlex.join(cmd),
                  on_wait=lambda m: console.err.print(f"[dim]waiting: {m}[/dim]"))
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
