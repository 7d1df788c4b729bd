"""SLURM: the nodes, node rank and rendezvous host of an allocation, and an sbatch job script.

Inside an allocation (`salloc`, `sbatch`, `srun`) SLURM sets, for each task (slurm.schedmd.com/srun.html,
"OUTPUT ENVIRONMENT VARIABLES"; sbatch.html):

    SLURM_JOB_NODELIST   the allocation's nodes, compressed: `node[01-03,07],gpu5`
    SLURM_NNODES         how many                 SLURM_NODEID   this node's index among them (0-based)
    SLURM_PROCID         this task's global rank  SLURM_JOB_ID   the job's id

`gpuwise launch` / `train` then run one torchrun per node (srun --ntasks-per-node=1), all with the same
c10d rendezvous on the first node (`scontrol show hostnames` order, which `expand_nodelist` reproduces), the
job id as rendezvous id. Pure functions over a given environment: tests pass SLURM's variables as a dict.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import GpuwiseError

RDZV_PORT = 29400  # torchrun's documented default c10d port (torch.distributed.run --rdzv-endpoint)


def expand_nodelist(nodelist: str) -> list[str]:
    """`node[01-03,07],gpu5` -> ["node01", "node02", "node03", "node07", "gpu5"] (zero padding kept)."""
    out: list[str] = []
    for part in _top_level_split(nodelist.strip()):
        m = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\](.*)", part)
        if not m:
            if part:
                out.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for rng in ranges.split(","):
            lo, _, hi = rng.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise GpuwiseError(f"cannot read SLURM node list {nodelist!r} (range {rng!r})")
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                for rest in expand_nodelist(suffix) if "[" in suffix else [suffix]:
                    out.append(f"{prefix}{i:0{width}d}{rest}")
    return out


def _top_level_split(text: str) -> list[str]:
    """Split at the commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


@dataclass(frozen=True)
class SlurmJob:
    nodes: list[str]
    node_rank: int
    proc_id: int
    job_id: str

    @property
    def nnodes(self) -> int:
        return len(self.nodes)

    @property
    def rdzv_endpoint(self) -> str:
        return f"{self.nodes[0]}:{RDZV_PORT}"

    def to_dict(self) -> dict:
        return {"nodes": self.nodes, "nnodes": self.nnodes, "node_rank": self.node_rank, "proc_id": self.proc_id,
                "job_id": self.job_id, "rdzv_endpoint": self.rdzv_endpoint}


def slurm_job(env: Mapping[str, str]) -> SlurmJob | None:
    """The allocation this process runs in, or None outside SLURM (no SLURM_JOB_NODELIST)."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        return None
    nodes = expand_nodelist(nodelist)
    nnodes = env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES")
    if nnodes and nnodes.isdigit() and int(nnodes) != len(nodes):
        raise GpuwiseError(f"SLURM_NNODES={nnodes} but SLURM_JOB_NODELIST={nodelist!r} names {len(nodes)} nodes")
    return SlurmJob(nodes=nodes, node_rank=int(env.get("SLURM_NODEID") or 0),
                    proc_id=int(env.get("SLURM_PROCID") or 0), job_id=env.get("SLURM_JOB_ID") or "gpuwise")


def launch_settings(env: Mapping[str, str], *, nnodes: int, rdzv_endpoint: str | None,
                    rdzv_id: str | None) -> dict | None:
    """The rendezvous settings a multi-node SLURM allocation implies for `launch` / `train`, or None where the
    user gave them or the allocation has one node (torchrun --standalone does)."""
    job = slurm_job(env)
    if job is None or job.nnodes == 1 or rdzv_endpoint is not None or nnodes != 1:
        return None
    return {"nnodes": job.nnodes, "node_rank": job.node_rank, "rdzv_endpoint": job.rdzv_endpoint,
            "rdzv_backend": "c10d", "rdzv_id": rdzv_id or job.job_id}


def sbatch_script(torchrun_target: list[str], *, nnodes: int, nproc_per_node: int, gpus: bool,
                  job_name: str = "gpuwise", env: Mapping[str, str] | None = None,
                  time_limit: str | None = None) -> str:
    """An sbatch job script: one task per node (srun), each a torchrun of `torchrun_target` with a c10d
    rendezvous on the first node of the allocation, the job id as rendezvous id."""
    if nnodes < 1 or nproc_per_node < 1:
        raise GpuwiseError("--sbatch needs at least one node and one rank per node")
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job_name}", f"#SBATCH --nodes={nnodes}",
             "#SBATCH --ntasks-per-node=1"]
    if gpus:
        lines.append(f"#SBATCH --gpus-per-node={nproc_per_node}")
    if time_limit:
        lines.append(f"#SBATCH --time={time_limit}")
    lines += ["# written by gpuwise (scaleout/slurm.py): one torchrun per node, c10d rendezvous on the first node",
              "set -euo pipefail",
              'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)']
    for k, v in sorted((env or {}).items()):
        lines.append(f"export {k}={shlex.quote(v)}")
    torchrun = ["torchrun", "--nnodes", "$SLURM_NNODES", "--nproc-per-node", str(nproc_per_node),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"$head_node:{RDZV_PORT}", "--rdzv-id", "$SLURM_JOB_ID",
                *torchrun_target]
    quoted = " ".join(a if a.startswith("$") else shlex.quote(a) for a in torchrun)
    lines.append(f"srun --ntasks-per-node=1 --kill-on-bad-exit=1 {quoted}")
    return "\n".join(lines) + "\n"
