"""NCCL's communicator buffers: device memory a data-parallel rank holds outside PyTorch's allocator.

NCCL connects each rank to its peers per *channel* (one CTA, one ring each) and gives every connection a
buffer per protocol (src/init.cc `computeBuffSizes`, the same from NCCL 2.18 through 2.29):

    LL      8 lines x 512 threads x 8 steps x 16 B      = 0.5 MiB
    LL128   120 elements x 640 threads x 8 steps x 8 B  = 4.6875 MiB
    Simple  1 << 22                                     = 4 MiB

A P2P connection (src/transport/p2p.cc `p2pSendSetup` / `p2pRecvSetup`) has a send side (a 4 KiB header, plus
the Simple buffer under P2P read, Ampere+ NVLink's default) and a receive side (a header and the other
buffers), each rounded up to CUDA_IPC_MIN (2 MiB): 2 + 10 MiB written, 6 + 6 MiB read, 12 MiB a
rank either way for each peer it sends to and receives from. A ring channel has one such pair; a tree
channel one per tree edge, 2 (n-1) / n on average over n ranks (a chain within a node, a binary tree
across). Net (InfiniBand) connections at a node's edge are counted the same.

Which algorithms get connected: NCCL >= 2.22 (PyTorch >= 2.7) connects an algorithm at its first collective
("Add lazy connection establishment for collective operations ... reduce memory usage", 2.22.3 release notes;
NCCL_RUNTIME_CONNECT=1, the default): all-gather and reduce-scatter run rings, all-reduce rings and trees
(NCCL picks the tree for small messages, and across nodes). So a sharded job within a node connects rings only,
and across nodes trees too: a training loop's small all-reduces (the loss it logs, the gradient norm it clips
by) run as trees there, where the tree's log2(nodes) latency beats the ring's (src/graph/tuning.cc). Earlier
NCCL (or NCCL_RUNTIME_CONNECT=0) connects rings and trees when the communicator is created (`eager`).

Not counted: NVLS (NVLink SHARP on H100 / B200 NVSwitch systems) and CollNet buffers, send/recv (pipeline,
all-to-all) buffers, and any second communicator PyTorch creates beyond the ones the strategy needs. NVLS's
are there only where the node enables multicast (fabric manager, driver), which gpuwise cannot tell; estimate's
note gives their size by NCCL version (src/transport/nvls.cc: `comm->nChannels * 2 * (buffSize + memSize) *
nHeads` through 2.21, 4 MiB then 1 MiB buffers; from 2.22 `ncclNvlsBufferSetup`, 16 NVLS channels x 2 x 1 MiB x
nHeads at NVLS's first use).
"""

from __future__ import annotations

import os

from ...errors import GpuwiseError
from ...units import fmt_bytes
from .split import Split

MIB = 2**20
NCCL_STEPS = 8
LL_BUFFER = 8 * 512 * NCCL_STEPS * 16      # NCCL_LL_LINES_PER_THREAD x NCCL_LL_MAX_NTHREADS x steps x ncclLLFifoLine
LL128_BUFFER = 120 * 640 * NCCL_STEPS * 8  # NCCL_LL128_ELEMS_PER_THREAD x NCCL_LL128_MAX_NTHREADS x steps x uint64
SIMPLE_BUFFER = 1 << 22                    # DEFAULT_BUFFSIZE
HEADER = 4096                              # ncclSendMem / ncclRecvMem (MEM_ALIGN)
IPC_ALIGN = 2 * MIB                        # CUDA_IPC_MIN: each side's allocation is rounded up to it


def _aligned(nbytes: int) -> int:
    return -(-nbytes // IPC_ALIGN) * IPC_ALIGN


# one peer's send and receive sides on a rank (P2P write: the receive side holds the three buffers)
CONNECTION_BYTES = _aligned(HEADER) + _aligned(HEADER + LL_BUFFER + LL128_BUFFER + SIMPLE_BUFFER)

# NVLink links per GPU (datasheets: V100 SXM2 6, A100 SXM4 12 third-generation, H100 SXM5 18 fourth-generation,
# B200 18 fifth-generation NVLinks)
NVLINKS_PER_GPU = {"nvlink2": 6, "nvlink3": 12, "nvlink4": 18, "nvlink5": 18}
# NCCL's bandwidth of one NVLink, GB/s (src/graph/topo.h SM70_NVLINK_BW 20.0, SM80 20.0, SM90 20.6, SM100 40.1)
NCCL_NVLINK_BW = {"nvlink2": 20.0, "nvlink3": 20.0, "nvlink4": 20.6, "nvlink5": 40.1}
# the ring search's first speed, GB/s a channel (src/graph/search.cc speedArrayIntra[0] 40, sm90SpeedArrayIntra[0]
# 60, sm100SpeedArrayIntra[0] 90)
NCCL_TOP_SPEED = {"nvlink2": 40.0, "nvlink3": 40.0, "nvlink4": 60.0, "nvlink5": 90.0}
NCCL_MAX_CHANNELS = 32
CONNECTS = ("lazy", "eager")
ALL_REDUCING = ("ddp", "zero1")  # strategies that all-reduce the gradients (hsdp: across nodes, below)


def channels(link: str, multi_node: bool) -> int:
    """NCCL's channels for a large collective (one CTA each). Within an NVLink node, as NCCL's topology search
    gets them: the ring search fills the GPU's NVLink bandwidth (links x NCCL's per-link bandwidth) with channels
    at its first speed, `ncclTopoDupChannels` doubles them (it does for every speed these start at: >= 25 GB/s,
    and >= 50 on Hopper and later), and `ncclTopoPostset` doubles them again ("Duplication should be complete
    now", src/graph/connect.cc), at most NCCL_MAX_CHANNELS. A100: 240 / 40 = 6 -> 24, which is NVIDIA/nccl
    issue 1703's "2 CTAs per NVLink" on its 12 NVLinks; H100: floor(370.8 / 60) = 6 -> 24 ("24 coll channels"
    on H100s, NVIDIA/nccl issue 1781's log), not 2 per NVLink's 36; V100: 3 -> 12. Across nodes "on DGX with 8
    NICs ... it would use 16 SMs", and "a PCI system with a single NIC ... 2 SMs" (NVIDIA/nccl issue 689)."""
    if multi_node:
        return 16
    if link in NVLINKS_PER_GPU:
        searched = int(NVLINKS_PER_GPU[link] * NCCL_NVLINK_BW[link] // NCCL_TOP_SPEED[link])
        return min(NCCL_MAX_CHANNELS, 4 * max(searched, 1))
    return 2


def connect_mode(connect: str | None = None, env: dict[str, str] | None = None) -> str:
    """`connect` ("lazy" / "eager"), else NCCL_RUNTIME_CONNECT's (0: eager), else lazy (NCCL >= 2.22)."""
    if connect is None:
        env = os.environ if env is None else env
        connect = "eager" if env.get("NCCL_RUNTIME_CONNECT", "").strip() == "0" else "lazy"
    if connect not in CONNECTS:
        raise GpuwiseError(f"NCCL connection {connect!r}: expected one of {', '.join(CONNECTS)}")
    return connect


def buffer_bytes(split: Split, link: str, connect: str = "lazy") -> int:
    """The device bytes of one rank's NCCL communicators under `split` on GPUs joined by `link` (within a node;
    `split.node_size` GPUs a node): the module's docstring. 0 on one GPU and for a pipeline (send/recv)."""
    connect = connect_mode(connect)
    if split.nproc < 2 or split.strategy in ("single", "pipeline"):
        return 0
    # (ranks, across nodes, all-reduces): one communicator each
    if split.strategy == "hsdp" and split.nproc > split.shards:
        groups = [(split.shards, False, False), (split.nproc // split.shards, True, True)]
    else:
        groups = [(split.nproc, split.nproc > split.node_size, split.strategy in ALL_REDUCING)]
    total = 0.0
    for ranks, multi_node, all_reduce in groups:
        tree = 2 * (ranks - 1) / ranks if connect == "eager" or all_reduce or multi_node else 0.0
        total += channels(link, multi_node) * (1 + tree) * CONNECTION_BYTES
    return int(total)


def nccl_note(nbytes: int, connect: str) -> str:
    """What a data-parallel rank's device used counts of NCCL (`buffer_bytes`) and what it leaves out, with the
    NVLS buffers' size by NCCL version (the module's docstring)."""
    how = ("lazy: NCCL >= 2.22 connects an algorithm at its first collective, rings for all-gather / "
           "reduce-scatter, rings and trees for all-reduce and across nodes" if connect == "lazy" else
           "eager: NCCL < 2.22 connects rings and trees when the communicator is created")
    return (f"device used counts {fmt_bytes(nbytes)} of NCCL communicator buffers, outside PyTorch's allocator "
            f"(12 MiB a channel and peer; {how}; --nccl-connect). Not counted, as gpuwise cannot tell whether the "
            "node enables them: NVLS buffers (NVLink SHARP on H100 / B200 NVSwitch nodes with multicast; "
            "NCCL_NVLS_ENABLE=0 turns them off), a rank's channels x 2 x (buffer + 2 MiB) x the node's ranks: "
            "2.25 GiB on 8 H100s under NCCL 2.18-2.20 (4 MiB buffers), 1.1 GiB under 2.21 (1 MiB), from 2.22 "
            "16 x 2 x 1 MiB x the node's ranks (256 MiB, rounded up to the multicast granularity) at their first "
            "use. Nor CollNet or send/recv buffers, or other communicators. Published: 544-688 MB per process "
            "group on 2-4 x A100, eager (NVIDIA/nccl issue 964)")
