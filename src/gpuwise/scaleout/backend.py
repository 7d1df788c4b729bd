"""The one seam to torchrun and torch.distributed: everything in gpuwise.scaleout goes through here.

Outside the job: `run_torchrun(argv, env)` starts `python -m torch.distributed.run ARGV` (torchrun) and
returns its exit code. Inside a worker torchrun started: `init()`, `rank()`, `world_size()`,
`local_rank()`, `restart_count()` (torchrun's environment variables), `wrap_ddp()`, `mean()`,
`gather()`, `barrier()`, `shutdown()`. Gradients are synchronised by DDP itself; `mean()` and
`gather()` only carry metrics (loss, timings) and checkpoint RNG states.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

from ..process import wait_forwarding_sigint

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def run_torchrun(argv: list[str], env: Mapping[str, str], stdout_to_stderr: bool = False,
                 log_path: str | None = None) -> int:
    """Run torchrun with `argv` in `env` (the full environment); its exit code (128+N for signal N).
    `stdout_to_stderr` keeps the ranks' prints off stdout (for --json). With `log_path`, torchrun's and the
    ranks' stderr go to that file; gpuwise's own progress lines ("[gpuwise ...") still show as they come,
    the rest is shown after a successful run (a failed one is summarised by the caller, scaleout/failure.py)."""
    if log_path is None:
        proc = subprocess.Popen(TORCHRUN + list(argv), env=dict(env), stdout=2 if stdout_to_stderr else None)  # fd 2
        return wait_forwarding_sigint(proc)  # on Ctrl-C torchrun stops its workers; wait for it
    import threading

    held: list[bytes] = []
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(TORCHRUN + list(argv), env=dict(env), stdout=2 if stdout_to_stderr else None,
                                stderr=subprocess.PIPE)

        def pump() -> None:
            for line in proc.stderr:
                log.write(line)
                log.flush()
                if line.startswith(b"[gpuwise"):
                    sys.stderr.buffer.write(line)
                    sys.stderr.buffer.flush()
                else:
                    held.append(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        code = wait_forwarding_sigint(proc)
        reader.join(timeout=10)
    if code == 0 and held:
        sys.stderr.buffer.write(b"".join(held))
        sys.stderr.buffer.flush()
    return code


# --- inside a worker -------------------------------------------------------------------------------

def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def restart_count() -> int:
    """How many times torchrun has restarted the worker group (0 on the first attempt)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def backend_for(device_type: str) -> str:
    """NCCL for CUDA ranks, gloo for CPU ranks (torch.distributed's own recommendation)."""
    return "nccl" if device_type == "cuda" else "gloo"


def worker_device():
    """cuda:LOCAL_RANK when this rank can see a GPU for itself, else the CPU."""
    import torch

    lr = local_rank()
    if torch.cuda.is_available() and torch.cuda.device_count() > lr:
        torch.cuda.set_device(lr)
        return torch.device("cuda", lr)
    return torch.device("cpu")


def init(device) -> str:
    """Join the process group torchrun set up (env:// rendezvous); returns the backend used."""
    import torch.distributed as dist

    backend = backend_for(device.type)
    if not dist.is_initialized():
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend=backend, **kwargs)
    return backend


def shutdown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def wrap_ddp(model, device, **kwargs):
    """DistributedDataParallel around `model` (device_ids only for CUDA ranks)."""
    from torch.nn.parallel import DistributedDataParallel

    if device.type == "cuda":
        return DistributedDataParallel(model, device_ids=[device.index], output_device=device.index, **kwargs)
    return DistributedDataParallel(model, **kwargs)


def mean(value: float, device) -> float:
    """The mean of a scalar metric over all ranks."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t)
        t /= dist.get_world_size()
    return float(t.item())


def gather(obj) -> list:
    """Every rank's `obj` (picklable), on every rank, in rank order."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def synchronize(device) -> None:
    """Wait for queued device work (timing on CUDA)."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)
