"""The monitor's one seam to `torch.cuda` (as devices/nvml.py is NVML's): events, memory counters, device
properties and autocast state. Tests replace these calls (tests/test_monitor_fake_cuda.py) to run the
monitor's GPU path on a CPU. Every function imports torch when called: the monitor imports without it."""

from __future__ import annotations

from typing import Any


def current_index() -> int:
    import torch

    return torch.cuda.current_device()


def timing_event() -> Any:
    """A recorded CUDA event with timing on (`elapsed_time` between two of them is device time, ms)."""
    import torch

    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def allocated_bytes(device) -> int:
    import torch

    return int(torch.cuda.memory_allocated(device))


def peak_bytes(device) -> tuple[int, int]:
    """(max allocated, max reserved) since the last `describe`'s reset."""
    import torch

    return int(torch.cuda.max_memory_allocated(device)), int(torch.cuda.max_memory_reserved(device))


def describe(device) -> dict[str, Any]:
    """Name, memory, compute capability and TF32 of `device`; resets its peak-memory counters."""
    import torch

    props = torch.cuda.get_device_properties(device)
    torch.cuda.reset_peak_memory_stats(device)
    return {"device_name": props.name, "device_total_bytes": int(props.total_memory),
            "capability": [props.major, props.minor], "tf32": bool(torch.backends.cuda.matmul.allow_tf32)}


def autocast_precision() -> str:
    """gpuwise's name for the precision a CUDA forward runs in now: the autocast dtype, else tf32 / fp32."""
    import torch

    if torch.is_autocast_enabled("cuda"):
        dtype = torch.get_autocast_dtype("cuda")
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))
    tf32 = torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"
    return "tf32" if tf32 else "fp32"
