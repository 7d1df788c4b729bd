"""`gpuwise gpus`: a table like nvidia-smi's, with the GPU `pick` would choose marked."""

from __future__ import annotations

from ..devices import discover, host_devices, rank
from ..devices.reserve import reserved_uuids
from ..report import console
from ..report.devices import gpu_table, host_table

HELP = "list GPUs (NVML, nvidia-smi or fake), their memory, utilisation and processes; the CPU when none"
EXAMPLES = """\
  gpuwise gpus
  gpuwise gpus --json | jq '.gpus[].memory_free_bytes'
  GPUWISE_FAKE_GPUS=tests/data/four_gpus.json gpuwise gpus   # fake GPUs, for CI
"""


def add_arguments(p) -> None:
    p.add_argument("--processes", action="store_true", help="list the processes on each GPU")
    p.add_argument("--uuid", action="store_true", help="show each GPU's UUID")


def run(args) -> int:
    found = discover()
    held = reserved_uuids() if found.gpus else set()
    best = rank([g for g in found.gpus if g.uuid not in held])[:1]
    hosts = host_devices()
    if args.json:
        d = found.to_dict()
        d["reserved_uuids"] = sorted(held)
        d["best_index"] = best[0].index if best else None
        d["host"] = [h.to_dict() for h in hosts]
        console.emit_json(d)
        return 0
    if found.gpus:
        console.out.print(gpu_table(found.gpus, best[0].index if best else None, held, args.processes, args.uuid))
        console.out.print(f"[dim]backend: {found.backend}; ★ = what `gpuwise pick` would choose now[/dim]")
    else:
        console.out.print(f"No GPU: {found.reason}. gpuwise will use the CPU.")
        console.out.print(host_table(hosts))
    return 0
