"""Memory that kernels allocate internally, below the dispatcher, where a fake trace cannot see it.

A registry of small pure functions `(device_type, args, kwargs) -> bytes`, one per aten op, each
citing where the allocation comes from. The tracer allocates the bytes just before the op runs and
frees them when it returns (a scratch buffer's life). cuDNN / cuBLAS workspaces that the CUDA caching
allocator holds across steps are not here: they are overheads of the allocator model (plan-gpu).
"""

from __future__ import annotations

from collections.abc import Callable

WORKSPACES: dict[str, Callable[[str, tuple, dict], int]] = {}


def register_workspace(op: str):
    """Register `fn(device_type, args, kwargs) -> bytes` for `op` ("aten::name" or "aten.name")."""
    key = op.replace("::", ".")

    def deco(fn):
        WORKSPACES[key] = fn
        return fn
    return deco


def workspace_bytes(op: str, device_type: str, args: tuple, kwargs: dict) -> int:
    """Bytes the kernel of `op` allocates internally for these arguments (0 when none are known)."""
    fn = WORKSPACES.get(op)
    return int(fn(device_type, args, kwargs)) if fn is not None else 0
