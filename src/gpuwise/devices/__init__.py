"""Devices: discovery (fake file, NVML, nvidia-smi), selection, reservation, and the seeds' helpers."""

from .discover import Discovery, discover, host_devices, list_gpus
from .model import Gpu, GpuProcess, HostDevice
from .select import Pick, cuda_environment, pick, rank, select

__all__ = ["Discovery", "Gpu", "GpuProcess", "HostDevice", "Pick", "cuda_environment", "discover",
           "host_devices", "list_gpus", "pick", "rank", "select", "try_all_gpus", "try_gpu"]


def try_gpu(i: int = 0):
    """`cuda:i` if torch can see that many GPUs, else the CPU (Dive into Deep Learning's `try_gpu`)."""
    import torch

    if torch.cuda.device_count() >= i + 1:
        return torch.device(f"cuda:{i}")
    return torch.device("cpu")


def try_all_gpus():
    """Every GPU torch can see, or `[cpu]` when there is none (Dive into Deep Learning's `try_all_gpus`)."""
    import torch

    devices = [torch.device(f"cuda:{i}") for i in range(torch.cuda.device_count())]
    return devices if devices else [torch.device("cpu")]
