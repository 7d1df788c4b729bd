"""`gpuwise launch -- train.py`: torchrun on GPUs that `pick` chose and reserved (CPU ranks without GPUs)."""

from __future__ import annotations

import shlex

from ..report import console
from ..scaleout import launch as launching
from .common import add_command_argument, add_gpu_selection_arguments, command_from_args, positive_int

HELP = "run a distributed script under torchrun on free GPUs (or CPU ranks with gloo), one rank per GPU"
EXAMPLES = """\
  gpuwise launch -n 2 -- train.py --epochs 10        # 2 free GPUs (or 2 CPU ranks), torchrun --standalone
  gpuwise launch -n 4 --min-free 20GiB --max-restarts 3 -- python -m mypkg.train
  gpuwise launch --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29400 -n 8 -- train.py   # on node0
  gpuwise launch --nnodes 2 --node-rank 1 --rdzv-endpoint node0:29400 -n 8 -- train.py   # on node1
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
    add_gpu_selection_arguments(p, per_gpu=True)


def launch_kwargs(args) -> dict:
    return {"nnodes": args.nnodes, "node_rank": args.node_rank, "rdzv_endpoint": args.rdzv_endpoint,
            "rdzv_backend": args.rdzv_backend, "rdzv_id": args.rdzv_id, "min_free": args.min_free,
            "max_util": args.max_util, "wait": args.wait}


def add_arguments(p) -> None:
    add_launch_arguments(p)
    p.add_argument("--dry-run", action="store_true", help="print the torchrun command line and exit")
    add_command_argument(p, "-- SCRIPT ARGS", "the script (or python -m module) to run")


def run(args) -> int:
    cmd = command_from_args(args)  # an empty command is refused by launching.target_args
    target = launching.target_args(cmd)
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
