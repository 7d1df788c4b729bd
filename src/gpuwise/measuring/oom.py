"""The one out-of-memory predicate, and the fake OOM used to test searches without a GPU."""

from __future__ import annotations

import os

FAKE_OOM_ENV = "GPUWISE_FAKE_OOM_ABOVE"

# Messages that mean "not enough device memory" (after accelerate.utils.memory.should_reduce_batch_size).
_OOM_MESSAGES = (
    "out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_NOT_SUPPORTED",  # cuDNN cannot get its workspace
    "DefaultCPUAllocator: can't allocate memory",
    "MPS backend out of memory",
)


def is_oom(exc: BaseException) -> bool:
    """True when `exc` means the device ran out of memory (and a smaller batch may fit)."""
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    except (ImportError, AttributeError):
        pass
    if isinstance(exc, (RuntimeError, MemoryError)):
        text = str(exc)
        return isinstance(exc, MemoryError) or any(m in text for m in _OOM_MESSAGES)
    return False


def fake_oom_threshold() -> int | None:
    value = os.environ.get(FAKE_OOM_ENV)
    return int(value) if value else None


def maybe_fake_oom(batch_size: int) -> None:
    """Raise a real `torch.OutOfMemoryError` when GPUWISE_FAKE_OOM_ABOVE is set and the batch exceeds it.

    Lets the batch searches run their real code paths in CI, as Lightning's tests do with a model that
    raises above a threshold."""
    limit = fake_oom_threshold()
    if limit is not None and batch_size > limit:
        import torch

        raise torch.OutOfMemoryError(f"CUDA out of memory (fake: {FAKE_OOM_ENV}={limit}, batch {batch_size})")
