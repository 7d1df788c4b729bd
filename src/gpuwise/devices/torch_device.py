"""The one resolver of a torch device argument (`--device`, `device=`) for measure, tune and the monitor."""

from __future__ import annotations

from ..errors import GpuwiseError


def resolve_device(device: str | None, *, other_types: bool = False) -> str:
    """'cuda' when a GPU is visible and nothing was asked ('auto', None), else 'cpu'; a named device is
    checked: a known type (cpu, cuda; any torch device type with `other_types`, as the monitor times
    a loop on whatever device it runs), and for cuda a GPU that this process can see."""
    import torch

    # torch.cuda.device_count() asks NVML (honouring CUDA_VISIBLE_DEVICES) without starting CUDA here:
    # the parent stays free to choose GPUs, and only the child initialises CUDA.
    count = torch.cuda.device_count()
    if device in (None, "", "auto"):
        return "cuda" if count else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise GpuwiseError(f"unknown device {device!r} (use cpu, cuda or cuda:N)") from exc
    if dev.type == "cuda":
        if not count:
            raise GpuwiseError(f"device {device!r}: no CUDA GPU is usable here (try --device cpu)")
        if dev.index is not None and dev.index >= count:
            raise GpuwiseError(f"device {device!r}: only {count} CUDA device(s) visible")
    elif dev.type != "cpu" and not other_types:
        raise GpuwiseError(f"device {device!r}: gpuwise supports cpu and cuda devices")
    return str(dev)


def with_index(device):
    """`device` (a torch.device) with an index: a bare "cuda" means the current CUDA device, as in torch (GPU 0
    of those this process sees unless it set another). torch.cuda.set_device(torch.device("cuda")) raises
    since torch 2.11 ("Expected a torch.device with a specified index"); other device types are returned as
    they are."""
    import torch

    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device
