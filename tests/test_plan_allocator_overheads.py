"""Process overheads: cuBLAS workspaces inserted into the allocator replay, context and cuDNN outside it."""

from __future__ import annotations

from gpuwise.plan.memory.events import MemEvent, MemoryTrace
from gpuwise.plan.memory.overheads import (
    CONTEXT_BYTES,
    CUDNN_CONTEXT_BYTES,
    add_workspaces,
    cublas_workspace_bytes,
    cublaslt_workspace_bytes,
)

MIB = 1024**2


def test_cublas_workspace_sizes_follow_torch_defaults_and_the_env():
    assert cublas_workspace_bytes("hopper", {}) == 32 * MIB                      # ":4096:8" on sm90
    assert cublas_workspace_bytes("ampere", {}) == 8 * MIB + 128 * 1024          # ":4096:2:16:8"
    assert cublas_workspace_bytes("ampere", {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}) == 16 * 1024
    assert cublas_workspace_bytes("hopper", {"CUBLAS_WORKSPACE_CONFIG": ":4096:8:16:8"}) == (4096 + 16) * 1024
    assert cublaslt_workspace_bytes("hopper", {}) == 0
    assert cublaslt_workspace_bytes("hopper", {"CUBLASLT_WORKSPACE_SIZE": "1024"}) == MIB


def ev(action, block, phase, op, nbytes=4096):
    return MemEvent(action, block, nbytes, "activations", phase, "fc", op)


def test_one_workspace_per_thread_at_its_first_matmul_never_freed():
    events = [ev("alloc", 0, "setup", "aten.empty"),
              ev("alloc", 1, "forward", "aten.relu"), ev("alloc", 2, "forward", "aten.addmm"),
              ev("alloc", 3, "backward", "aten.mm"), ev("alloc", 4, "backward", "aten.mm"),
              ev("alloc", 5, "forward", "aten.addmm")]
    trace = MemoryTrace(events, steady_start=1, device_type="cuda")
    out, over = add_workspaces(trace, "ampere", env={})
    ws = [(i, e) for i, e in enumerate(out.events) if e.op.startswith("kernel workspace")]
    # right after the first forward matmul (index 2) and the first backward matmul (index 3 -> 4 after the insert)
    assert [i for i, _ in ws] == [3, 5]
    assert all(e.nbytes == 8 * MIB + 128 * 1024 and e.action == "alloc" for _, e in ws)
    assert out.steady_start == 1 and len(out.events) == len(events) + 2
    assert over.workspace_bytes == 2 * (8 * MIB + 128 * 1024)
    assert over.context_bytes == CONTEXT_BYTES["ampere"] and over.cudnn_bytes == 0


def test_convolutions_bring_cudnn_and_no_matmul_means_no_cublas():
    trace = MemoryTrace([ev("alloc", 0, "forward", "aten.convolution")], 0, "cuda")
    out, over = add_workspaces(trace, "hopper", env={})
    assert over.workspaces == () and over.cudnn_bytes == CUDNN_CONTEXT_BYTES
    assert over.outside_allocator_bytes == CONTEXT_BYTES["hopper"] + CUDNN_CONTEXT_BYTES
