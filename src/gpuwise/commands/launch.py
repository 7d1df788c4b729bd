"""`gpuwise launch -- train.py`: torchrun on GPUs that `pick` chose and reserved (CPU ranks without GPUs)."""

from __future__ import annotations

import os
import shlex

from ..errors import GpuwiseError
from ..report import console
from ..scaleout import launch as launching
from ..scaleout import slurm
from .common import add_command_argument, add_gpu_selection_arguments, command_from_args, positive_int

HELP = "run a distributed script under torchrun on free GPUs (or CPU ranks with gloo), one rank per GPU"
EXAMPLES = """\
  gpuwise launch -n 2 -- train.py --epochs 10        # 2 free GPUs (or 2 CPU ranks), torchrun --standalone
  gpuwise launch -n 4 --min-free 20GiB --max-restarts 3 -- python -m mypkg.train
  gpuwise launch --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29400 -n 8 -- train.py   # on node0
  gpuwise launch --nnodes 2 --node-rank 1 --rdzv-endpoint node0:29400 -n 8 -- train.py   # on node1
  srun --ntasks-per-node=1 gpuwise launch -n 8 -- train.py   # in a SLURM allocation: nodes, rendezvous from SLURM_*
  gpuwise launch --nnodes 4 -n 8 --sbatch job.sh -- train.py && sbatch job.sh       # a job script to submit
The script reads RANK, LOCAL_RANK, WORLD_SIZE as set by torchrun; GPUWISE_DIST_BACKEND says nccl or gloo.
The exit code is torchrun's; the GPUs stay reserved until it ends. See docs/multi-node.md.
"""


def add_launch_arguments(p) -> None:
    """Arguments shared by launch and train."""
    p.add_argument("-n", "--nproc", type=positive_int, default=None,
                   help="ranks per node: GPUs to pick (default: every free GPU), or CPU ranks (default 1)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="auto: GPUs when there are any, else CPU ranks (gloo)")
    p.add_argument("--nnodes", type=positive_int, default=1, help="number of nodes (default 1)")
    p.add_argument("--node-rank", type=int, default=None, help="this node's rank (static rendezvous)")
    p.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of the rendezvous, the same on every node")
    p.add_argument("--rdzv-backend", choices=["c10d", "static"], default="c10d",
                   help="c10d (default; elastic, node ranks assigned on arrival) or static (uses --node-rank)")
    p.add_argument("--rdzv-id", default=None, help="job id, the same on every node (default gpuwise)")
    p.add_argument("--max-restarts", type=int, default=0, help="torchrun restarts of the worker group on failure")
    p.add_argument("--sbatch", metavar="FILE", default=None,
                   help="write a SLURM job script (srun + torchrun, c10d rendezvous on the first node) and exit")
    add_gpu_selection_arguments(p, per_gpu=True)


def launch_kwargs(args, env=None) -> dict:
    """The launch settings from the arguments; inside a multi-node SLURM allocation the nodes, this node's
    rank and the rendezvous come from SLURM's variables unless given (scaleout/slurm.py)."""
    kw = {"nnodes": args.nnodes, "node_rank": args.node_rank, "rdzv_endpoint": args.rdzv_endpoint,
          "rdzv_backend": args.rdzv_backend, "rdzv_id": args.rdzv_id, "min_free": args.min_free,
          "max_util": args.max_util, "wait": args.wait}
    found = slurm.launch_settings(os.environ if env is None else env, nnodes=args.nnodes,
                                  rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id)
    if found:
        kw.update(found)
        console.err.print(f"[dim]SLURM allocation: node {found['node_rank']} of {found['nnodes']}, "
                          f"rendezvous {found['rdzv_endpoint']} (id {found['rdzv_id']})[/dim]")
    return kw


def write_sbatch(args, target: list[str], job_name: str) -> dict:
    """Write the --sbatch job script for torchrun's `target`; what it wrote, for --json."""
    gpus = args.device != "cpu"
    nproc = args.nproc or 1
    env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "GPUWISE_DIST_BACKEND": "nccl" if gpus else "gloo"}
    text = slurm.sbatch_script(target, nnodes=args.nnodes, nproc_per_node=nproc, gpus=gpus, job_name=job_name,
                               env=env)
    try:
        with open(args.sbatch, "w") as fh:
            fh.write(text)
    except OSError as exc:
        raise GpuwiseError(f"--sbatch {args.sbatch!r}: {exc.strerror or exc}") from None
    console.err.print(f"gpuwise: wrote {args.sbatch} ({args.nnodes} node(s) x {nproc} rank(s)); submit it with "
                      f"`sbatch {args.sbatch}`")
    return {"sbatch": os.path.abspath(args.sbatch), "nnodes": args.nnodes, "nproc_per_node": nproc,
            "device_type": "cuda" if gpus else "cpu"}


def add_arguments(p) -> None:
    add_launch_arguments(p)
    p.add_argument("--dry-run", action="store_true", help="print the torchrun command line and exit")
    add_command_argument(p, "-- SCRIPT ARGS", "the script (or python -m module) to run")


def run(args) -> int:
    cmd = command_from_args(args)  # an empty command is refused by launching.target_args
    target = launching.target_args(cmd)
    if args.sbatch:
        written = write_sbatch(args, target, "gpuwise-launch")
        if args.json:
            console.emit_json({**written, "command": cmd})
        return 0
    plan = launching.prepare(target, nproc_per_node=args.nproc, max_restarts=args.max_restarts, device=args.device,
                             command=shlex.join(cmd), on_wait=lambda m: console.err.print(f"[dim]waiting: {m}[/dim]"),
                             **launch_kwargs(args))
    console.err.print(f"[dim]gpuwise launch: {plan.world_size} rank(s) on {plan.device_type} ({plan.backend}): "
                      f"{plan.command_line()}[/dim]")
    if args.dry_run:
        plan.release()
        code = 0
    else:
        code = launching.launch(plan, stdout_to_stderr=args.json)
    if args.json:
        console.emit_json({**plan.to_dict(), "command": cmd, "exit_code": code, "dry_run": args.dry_run})
    elif args.dry_run:
        print(plan.command_line())
    return code
