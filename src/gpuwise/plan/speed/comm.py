"""NCCL collective time by message size, number of ranks and link: the alpha-beta model of nccl-tests.

nccl-tests (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md) reports for each collective an
*algorithm bandwidth* `algbw = bytes / time` and a *bus bandwidth* `busbw = algbw x factor`, where the
factor is the fraction of the data each rank must send over its slowest link for the ring algorithm:

    all_reduce       2 (n-1) / n        (a reduce-scatter followed by an all-gather)
    reduce_scatter   (n-1) / n          (`bytes` is the full, unsharded buffer)
    all_gather       (n-1) / n          (`bytes` is the full, gathered buffer)
    broadcast/reduce 1

busbw is what a link sustains, independent of n, so the time of a collective is

    time = latency + bytes x factor(n) / busbw(link)

`busbw(link)` is the per-direction datasheet bandwidth of the link times the fraction nccl-tests reach on
it (LINKS below, each number cited). Across nodes the ring crosses each node's NICs once per channel
(rail-optimised fabrics: one NIC per GPU), so the inter-node busbw is the node's NIC bandwidth over
NICs (NCCL runs one ring per channel, each through its own NIC): busbw = min(intra-node busbw, NICs per
node x NIC busbw); the slower of the two bounds the ring. The ring's latency on NCCL's links is NCCL's own
tuning model (`nccl_ring_s`: a base plus a per-step latency by protocol and hop, the steps that leave a node
at the network's; the protocol of least time, as NCCL picks it), so it grows with ranks and nodes. The tree
algorithm (NCCL >= 2.4, multi-node all-reduce) has the same bandwidth term and a latency growing with
log2(nodes) instead of n.

Public entry points: `all_reduce_s`, `reduce_scatter_s`, `all_gather_s`, `collective_s`, and
`link_for_gpu` (the link a catalog GPU uses between its ranks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import GpuwiseError
from ..catalog import DEFAULT_SPEED, SPEED
from ..memory.nccl import channels as nccl_channels

GB = 1e9
US = 1e-6


@dataclass(frozen=True)
class Link:
    """One kind of GPU-to-GPU link. `datasheet_bytes_per_s`: per direction, per GPU."""

    name: str
    datasheet_bytes_per_s: float
    efficiency: float          # achieved nccl-tests busbw / datasheet, for large messages (>= 256 MiB)
    latency_s: float           # per-collective base latency (small-message time in nccl-tests)
    source: str
    nccl_hw: str | None = None  # NCCL's hardware class for its latency model: nvlink, pci, net (None: not NCCL)

    @property
    def busbw_bytes_per_s(self) -> float:
        return self.datasheet_bytes_per_s * self.efficiency


# Efficiencies, from published nccl-tests all_reduce_perf runs (large messages, ring, no NVLS/SHARP):
#  - NVLink (NVSwitch systems): 8x A100 SXM4 230-250 GB/s busbw of 300 GB/s per direction (0.77-0.83);
#    8x H100 SXM5 460-480 GB/s of 450 with NVLink SHARP (NVLS) enabled, i.e. ring without it is bounded
#    by the same ~0.8 ("NCCL-tests in practice", docs.alayanew.com/en/docs/tech-blog/2026-05-06-nccl-tests,
#    reference table). A100 sendrecv_perf: 195 GB/s of 300 (0.65, li-plus/playground cuda/nccl.md) is
#    point-to-point, not a ring collective. We use 0.80 for every NVLink generation.
#  - PCIe: 8x H100 PCIe (no NVSwitch), all_reduce busbw 35-45 GB/s of PCIe Gen5 x16's 64 GB/s (0.55-0.70,
#    same table): 0.62 for every PCIe generation.
#  - InfiniBand / RoCE with GPUDirect RDMA: NIC line rate x 0.90 (nccl-tests multi-node guidance in the
#    same reference: busbw more than 20 % below line rate indicates a misconfiguration).
# Latencies: nccl-tests small-message (8 B) all_reduce times of 10-20 us within a node (2 GPUs: 14-15 us,
# a published run on PCIe); inter-node adds a network round trip (~5-10 us per IB hop). Model: 15 us
# intra-node, 25 us across nodes.
NVLINK_EFFICIENCY = 0.80
PCIE_EFFICIENCY = 0.62
NETWORK_EFFICIENCY = 0.90
INTRA_NODE_LATENCY_S = 15 * US
INTER_NODE_LATENCY_S = 25 * US
HOP_LATENCY_S = 1 * US

LINKS: dict[str, Link] = {link.name: link for link in [
    # NVLink per-GPU per-direction bandwidth: V100 SXM2 NVLink2 300 GB/s total (150 each way), A100 SXM4
    # NVLink3 600 GB/s (300), H100/H200 SXM5 NVLink4 900 GB/s (450), B200 NVLink5 1.8 TB/s (900)
    # (NVIDIA V100, A100, H100, HGX B200 datasheets)
    Link("nvlink2", 150 * GB, NVLINK_EFFICIENCY, INTRA_NODE_LATENCY_S, "NVIDIA V100 datasheet (NVLink 300 GB/s)", "nvlink"),
    Link("nvlink3", 300 * GB, NVLINK_EFFICIENCY, INTRA_NODE_LATENCY_S, "NVIDIA A100 datasheet (NVLink 600 GB/s)", "nvlink"),
    Link("nvlink4", 450 * GB, NVLINK_EFFICIENCY, INTRA_NODE_LATENCY_S, "NVIDIA H100 datasheet (NVLink 900 GB/s)", "nvlink"),
    Link("nvlink5", 900 * GB, NVLINK_EFFICIENCY, INTRA_NODE_LATENCY_S, "NVIDIA HGX B200 datasheet (NVLink 1.8 TB/s)", "nvlink"),
    # PCIe x16 per direction: Gen3 16 GB/s, Gen4 32 GB/s, Gen5 64 GB/s (PCI-SIG specifications, rounded)
    Link("pcie3", 16 * GB, PCIE_EFFICIENCY, INTRA_NODE_LATENCY_S, "PCI-SIG PCIe 3.0 x16", "pci"),
    Link("pcie4", 32 * GB, PCIE_EFFICIENCY, INTRA_NODE_LATENCY_S, "PCI-SIG PCIe 4.0 x16", "pci"),
    Link("pcie5", 64 * GB, PCIE_EFFICIENCY, INTRA_NODE_LATENCY_S, "PCI-SIG PCIe 5.0 x16", "pci"),
    # InfiniBand per NIC (one per GPU on rail-optimised DGX/HGX nodes): EDR 100 Gb/s, HDR 200 Gb/s,
    # NDR 400 Gb/s, XDR 800 Gb/s (NVIDIA ConnectX-5/6/7/8 datasheets); 8 bits per byte
    Link("ib-edr", 100 / 8 * GB, NETWORK_EFFICIENCY, INTER_NODE_LATENCY_S, "NVIDIA ConnectX-5 (EDR 100 Gb/s)", "net"),
    Link("ib-hdr", 200 / 8 * GB, NETWORK_EFFICIENCY, INTER_NODE_LATENCY_S, "NVIDIA ConnectX-6 (HDR 200 Gb/s)", "net"),
    Link("ib-ndr", 400 / 8 * GB, NETWORK_EFFICIENCY, INTER_NODE_LATENCY_S, "NVIDIA ConnectX-7 (NDR 400 Gb/s)", "net"),
    Link("ib-xdr", 800 / 8 * GB, NETWORK_EFFICIENCY, INTER_NODE_LATENCY_S, "NVIDIA ConnectX-8 (XDR 800 Gb/s)", "net"),
    # Ethernet without RDMA (NCCL's socket transport): 100 GbE, efficiency as IB (an upper bound)
    Link("eth-100g", 100 / 8 * GB, NETWORK_EFFICIENCY, 2 * INTER_NODE_LATENCY_S, "IEEE 802.3 100GbE", "net"),
]}

# busbw factor per collective, ring algorithm (nccl-tests doc/PERFORMANCE.md)
BUSBW_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}

DEFAULT_NETWORK = {"nvlink2": "ib-edr", "nvlink3": "ib-hdr", "nvlink4": "ib-ndr", "nvlink5": "ib-xdr"}
GPUS_PER_NODE = 8


# NCCL's own latency model of a ring collective (src/graph/tuning.cc, ncclTopoTuneModel; the ring constants
# are the same from NCCL 2.18, PyTorch 2.1's, through 2.29), in us, per protocol (LL, LL128, Simple):
#   latency = baseLat + (steps - interSteps) x intraLat + interSteps x interLat
# steps = n-1 (all-gather, reduce-scatter), 2(n-1) (all-reduce), n (broadcast, reduce); interSteps the steps
# that leave a node: nodes-1, 2(nodes-1) for all-reduce. Across nodes each intra-node step costs at least the
# network post overhead (getNetOverhead: 1 us on x86 Intel and other CPUs, 2 us on AMD; x3 for Simple).
# NCCL runs the protocol of least `latency + bytes / bw`: Simple at the busbw, LL128 at 0.92 of it (enabled by
# default only on NVLink: "Enable LL128 by default only on Volta/Ampere/Hopper+NVLink"), LL at a quarter (across
# nodes or all-reduce; a third otherwise), at most llMaxBw (one node: 87.7 GB/s on Ampere/Hopper, 39 on Volta;
# two nodes 39, more 20.4, x86 Intel).
NCCL_RING_BASE_US = {"LL": 6.6, "LL128": 14.0, "Simple": 8.4}
NCCL_RING_HW_US = {"nvlink": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4},
                   "pci": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7},
                   "net": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0}}
NCCL_NET_OVERHEAD_US = 1.0


def nccl_ring_s(op: str, nbytes: float, nranks: int, nodes: int, busbw: float, hw: str, volta: bool = False) -> float:
    """A ring collective's time under NCCL's tuning model (above): the least over the enabled protocols."""
    steps = {"all_reduce": 2 * (nranks - 1), "reduce_scatter": nranks - 1, "all_gather": nranks - 1}.get(op, nranks)
    inter = 0 if nodes == 1 else {"all_reduce": 2 * (nodes - 1)}.get(op, nodes - 1)
    ll_max = (39 if volta else 87.7) * GB if nodes == 1 else (39 if nodes == 2 else 20.4) * GB
    bandwidth = {"Simple": busbw, "LL128": 0.92 * busbw,
                 "LL": min(ll_max, busbw / (4 if nodes > 1 or op == "all_reduce" else 3))}
    best = math.inf
    for proto, bw in bandwidth.items():
        if proto == "LL128" and hw != "nvlink":
            continue
        intra_us = NCCL_RING_HW_US[hw][proto]
        if nodes > 1:
            intra_us = max(intra_us, NCCL_NET_OVERHEAD_US * (3 if proto == "Simple" else 1))
        latency_us = (NCCL_RING_BASE_US[proto] + (steps - inter) * intra_us
                      + inter * NCCL_RING_HW_US["net"][proto])
        best = min(best, latency_us * US + nbytes * BUSBW_FACTORS[op](nranks) / bw)
    return best


def nccl_sms(link: str, multi_node: bool) -> int:
    """SMs a large NCCL collective occupies while it runs: one CTA per channel (plan/memory/nccl.py `channels`),
    and "NCCL CTAs won't share an SM with compute kernels" (NCCL maintainer, NVIDIA/nccl issue 689)."""
    return nccl_channels(link, multi_node)


def node_network(gbps_per_node: float) -> Link:
    """A node's stated node-to-node bandwidth (Gb/s, all its NICs together: "128 GPUs with 400Gbps"), as one
    link per node at the InfiniBand/RoCE efficiency (use with nics_per_node=1)."""
    if gbps_per_node <= 0:
        raise GpuwiseError(f"node network bandwidth must be > 0 Gb/s, got {gbps_per_node}")
    return Link(f"node-{gbps_per_node:g}gbps", gbps_per_node / 8 * GB, NETWORK_EFFICIENCY, INTER_NODE_LATENCY_S,
                "the job's stated node-to-node bandwidth", "net")


def get_link(link: str | Link) -> Link:
    if isinstance(link, Link):
        return link
    try:
        return LINKS[link.lower()]
    except KeyError:
        raise GpuwiseError(f"unknown link {link!r}: known links: {', '.join(LINKS)}") from None


def link_for_gpu(gpu_id: str) -> str:
    """The intra-node link name for a catalog GPU id ("h100-sxm" -> "nvlink4"; PCIe cards -> "pcie4"):
    SXM parts on NVSwitch baseboards, the rest over PCIe (plan/catalog.py SPEED, from the datasheets)."""
    return SPEED.get(gpu_id, DEFAULT_SPEED).link


def network_for_link(link: str) -> str:
    """The inter-node network usually paired with a node's link (DGX generations: V100 EDR, A100 HDR,
    H100 NDR, B200 XDR); PCIe servers: HDR."""
    return DEFAULT_NETWORK.get(link, "ib-hdr")


def collective_s(op: str, nbytes: float, nranks: int, link: str | Link = "nvlink4", *,
                 gpus_per_node: int = GPUS_PER_NODE, network: str | Link | None = None,
                 nics_per_node: int | None = None, algorithm: str = "ring") -> float:
    """Seconds for one NCCL collective `op` over `nbytes` (the full buffer) on `nranks` ranks.

    Ranks fill nodes of `gpus_per_node`; within a node they talk over `link`, across nodes over
    `network` (default: the DGX generation's InfiniBand) with `nics_per_node` NICs (default: one per
    GPU). The ring runs at the slower of the intra-node busbw and the node's NICs x NIC busbw.
    `algorithm`: "ring" (latency x (n-1)) or "tree" (latency x log2 n, NCCL's multi-node all-reduce).
    """
    if op not in BUSBW_FACTORS:
        raise GpuwiseError(f"unknown collective {op!r}: one of {', '.join(BUSBW_FACTORS)}")
    if nranks < 1 or nbytes < 0:
        raise GpuwiseError(f"a collective needs nranks >= 1 and bytes >= 0, got {nranks}, {nbytes}")
    if nranks == 1 or nbytes == 0:
        return 0.0
    intra = get_link(link)
    busbw = intra.busbw_bytes_per_s
    latency = intra.latency_s
    nodes = math.ceil(nranks / gpus_per_node)
    if nodes > 1:
        net = get_link(network or network_for_link(intra.name))
        nics = nics_per_node if nics_per_node is not None else min(gpus_per_node, nranks)
        # NCCL runs one ring per channel and each channel leaves the node through its own NIC, so the
        # node's NICs carry its rings in parallel: inter-node busbw = NICs x NIC busbw (8 x NDR 400 Gb/s
        # x 0.9 = 360 GB/s, as multi-node DGX H100 all_reduce_perf runs report)
        busbw = min(busbw, nics * net.busbw_bytes_per_s)
        latency = max(latency, net.latency_s)
    if algorithm == "ring" and intra.nccl_hw is not None:
        return nccl_ring_s(op, nbytes, nranks, nodes, busbw, intra.nccl_hw, volta=intra.name == "nvlink2")
    if algorithm == "ring":
        steps = nranks - 1
    elif algorithm == "tree":
        steps = max(1, math.ceil(math.log2(nranks)))
    else:
        raise GpuwiseError(f"unknown algorithm {algorithm!r}: ring or tree")
    # one base latency per collective plus a hop per step: NCCL's own tuning model (src/graph/tuning.cc,
    # hwLat) charges ~0.6-1 us per NVLink/PCIe hop and a few us per network hop; 1 us is taken per step
    return latency + steps * HOP_LATENCY_S + nbytes * BUSBW_FACTORS[op](nranks) / busbw


def all_reduce_s(nbytes: float, nranks: int, link: str | Link = "nvlink4", **kw) -> float:
    """Seconds to all-reduce `nbytes` on `nranks` ranks over `link` (ring: 2(n-1)/n x bytes / busbw)."""
    return collective_s("all_reduce", nbytes, nranks, link, **kw)


def reduce_scatter_s(nbytes: float, nranks: int, link: str | Link = "nvlink4", **kw) -> float:
    """Seconds to reduce-scatter a buffer of `nbytes` (unsharded size) on `nranks` ranks: (n-1)/n x bytes / busbw."""
    return collective_s("reduce_scatter", nbytes, nranks, link, **kw)


def all_gather_s(nbytes: float, nranks: int, link: str | Link = "nvlink4", **kw) -> float:
    """Seconds to all-gather into a buffer of `nbytes` (gathered size) on `nranks` ranks: (n-1)/n x bytes / busbw."""
    return collective_s("all_gather", nbytes, nranks, link, **kw)
