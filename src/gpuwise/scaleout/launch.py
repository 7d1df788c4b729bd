"""Launching a job under torchrun on the GPUs `pick` chose (or on CPU ranks where there is no GPU).

`launch_environment()` and `torchrun_args()` are pure functions (the environment to add and the
torchrun arguments); `prepare()` picks and reserves the GPUs and returns a `LaunchPlan`; `launch()`
applies it and runs torchrun through `backend.run_torchrun`. Nothing here writes its own launcher.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..devices import discover, pick
from ..devices.select import Pick, qualifies, visible_devices_environment, visible_restriction
from ..errors import GpuwiseError
from ..units import parse_bytes
from . import backend

PYTHONS = {"python", "python3", os.path.basename(sys.executable)}


@dataclass
class LaunchPlan:
    """What `launch()` will run: torchrun's arguments, the environment added, the GPUs held."""

    nproc_per_node: int
    nnodes: int
    device_type: str                  # "cuda" or "cpu"
    backend: str                      # "nccl" or "gloo"
    torchrun_args: list[str]
    env: dict[str, str]               # added to os.environ
    reservation: Pick | None = field(default=None, repr=False)

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    def command_line(self) -> str:
        extra = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return f"{extra} torchrun {shlex.join(self.torchrun_args)}".strip()

    def release(self) -> None:
        if self.reservation is not None:
            self.reservation.release()

    def to_dict(self) -> dict:
        return {"nproc_per_node": self.nproc_per_node, "nnodes": self.nnodes, "world_size": self.world_size,
                "device_type": self.device_type, "backend": self.backend, "env": self.env,
                "torchrun_args": self.torchrun_args}


def launch_environment(*, cuda_visible_devices: str | None, nproc_per_node: int, cpu_count: int,
                       base_env: Mapping[str, str]) -> dict[str, str]:
    """The variables to add for the ranks (pure). GPUs: the chosen ones in PCI-bus order, NCCL.
    CPU ranks: gloo, and the cores split between the ranks (OMP_NUM_THREADS, unless already set;
    torchrun would otherwise set 1)."""
    env = {}
    if "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in base_env:
        # torchrun's c10d rendezvous shares its TCPStore with the workers' init_process_group by default;
        # after a restart the new group then hangs in init_process_group (seen here with gloo, torch 2.13;
        # pytorch/pytorch#135712). A store of their own per attempt restarts cleanly.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    if cuda_visible_devices is not None:
        return {**env, **visible_devices_environment(cuda_visible_devices), "GPUWISE_DIST_BACKEND": "nccl"}
    env["GPUWISE_DIST_BACKEND"] = "gloo"
    if "OMP_NUM_THREADS" not in base_env:
        env["OMP_NUM_THREADS"] = str(max(1, cpu_count // max(1, nproc_per_node)))
    return env


def target_args(cmd: list[str]) -> list[str]:
    """torchrun's arguments for the user's command: `train.py a b`, `python train.py`, `python -m pkg`
    or any executable (`--no-python`)."""
    if not cmd:
        raise GpuwiseError("no command given: use `gpuwise launch -n 2 -- train.py ...`")
    if os.path.basename(cmd[0]) in PYTHONS and len(cmd) > 1:
        rest = cmd[1:]
        if rest[0] == "-m":
            if len(rest) < 2:
                raise GpuwiseError("`python -m` needs a module name")
            return ["--module", *rest[1:]]
        if rest[0].startswith("-"):
            raise GpuwiseError(f"cannot pass python option {rest[0]!r} through torchrun; put it in PYTHONFLAGS or the script")
        return rest
    if cmd[0].endswith(".py"):
        return list(cmd)
    return ["--no-python", *cmd]


def torchrun_args(target: list[str], *, nproc_per_node: int, nnodes: int = 1, node_rank: int | None = None,
                  rdzv_endpoint: str | None = None, rdzv_backend: str = "c10d", rdzv_id: str | None = None,
                  max_restarts: int = 0) -> list[str]:
    """torchrun's argument list (pure). One node: `--standalone` (a c10d store on a free local port).
    Several nodes: the same `--rdzv-*` on every node; `--node-rank` only for the static backend
    (torchrun ignores it, with a warning, for c10d)."""
    args = ["--nproc-per-node", str(nproc_per_node)]
    if nnodes == 1 and rdzv_endpoint is None:
        args.append("--standalone")
    else:
        if rdzv_endpoint is None:
            raise GpuwiseError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every node)")
        args += ["--nnodes", str(nnodes), "--rdzv-backend", rdzv_backend, "--rdzv-endpoint", rdzv_endpoint,
                 "--rdzv-id", rdzv_id or "gpuwise"]
        if node_rank is not None and rdzv_backend == "static":  # c10d assigns node ranks itself
            args += ["--node-rank", str(node_rank)]
    if max_restarts:
        args += ["--max-restarts", str(max_restarts)]
    return args + list(target)


def prepare(target: list[str], *, nproc_per_node: int | None = None, nnodes: int = 1, node_rank: int | None = None,
            rdzv_endpoint: str | None = None, rdzv_backend: str = "c10d", rdzv_id: str | None = None,
            max_restarts: int = 0, min_free: int | str = 0, max_util: float | None = None,
            wait: float | str | None = None, device: str = "auto", command: str = "",
            on_wait: Callable[[str], None] | None = None) -> LaunchPlan:
    """Choose the devices (reserving GPUs for this process's life) and compute what to run.

    nproc_per_node None: every GPU that qualifies, or 1 CPU rank. device: auto | cuda | cpu.
    """
    if nnodes < 1:
        raise GpuwiseError(f"--nnodes must be at least 1, got {nnodes}")
    if device not in ("auto", "cuda", "cpu"):
        raise GpuwiseError(f"device must be auto, cuda or cpu, got {device!r}")
    found = discover() if device != "cpu" else None
    use_gpus = bool(found and found.gpus)
    if device == "cuda" and not use_gpus:
        raise GpuwiseError(f"no GPU found ({found.reason if found else 'cpu asked'}); drop --device cuda to use CPU ranks")
    reservation = None
    if use_gpus:
        if nproc_per_node is None:
            nproc_per_node = max(1, len(qualifying_gpus(found.gpus, min_free, max_util)))
        reservation = pick(nproc_per_node, min_free=min_free, max_util=max_util, wait=wait,
                           reserve_for="process", set_env=False, command=command, on_wait=on_wait)
        nproc_per_node = len(reservation.devices)
    nproc_per_node = nproc_per_node or 1
    env = launch_environment(cuda_visible_devices=reservation.cuda_visible_devices if reservation else None,
                             nproc_per_node=nproc_per_node, cpu_count=os.cpu_count() or 1, base_env=os.environ)
    args = torchrun_args(target, nproc_per_node=nproc_per_node, nnodes=nnodes, node_rank=node_rank,
                         rdzv_endpoint=rdzv_endpoint, rdzv_backend=rdzv_backend,
                         rdzv_id=rdzv_id or (None if nnodes == 1 else "gpuwise"), max_restarts=max_restarts)
    kind = "cuda" if use_gpus else "cpu"
    return LaunchPlan(nproc_per_node, nnodes, kind, backend.backend_for(kind), args, env, reservation)


def qualifying_gpus(gpus: list, min_free: int | str, max_util: float | None) -> list:
    """The GPUs (within an already-set CUDA_VISIBLE_DEVICES) that meet --min-free / --max-util now: what
    a job without -n gets, one rank each (at least one: pick then waits for it, or says why not)."""
    visible = visible_restriction(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
    return [g for g in visible if qualifies(g, parse_bytes(min_free), max_util)]


def launch(plan: LaunchPlan, extra_env: Mapping[str, str] | None = None, stdout_to_stderr: bool = False,
           log_path: str | None = None) -> int:
    """Run torchrun for `plan`; releases the GPUs afterwards; returns torchrun's exit code. With `log_path`
    the ranks' stderr is kept there (backend.run_torchrun)."""
    env = {**os.environ, **plan.env, **(extra_env or {})}
    try:
        return backend.run_torchrun(plan.torchrun_args, env, stdout_to_stderr, log_path)
    finally:
        plan.release()
