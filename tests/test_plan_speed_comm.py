"""The NCCL collective model (plan/speed/comm.py): nccl-tests' busbw arithmetic, CPU only."""

import pytest

from gpuwise.errors import GpuwiseError
from gpuwise.plan.speed import comm

GB = 1e9


def test_all_reduce_ring_busbw_arithmetic():
    # 8 ranks on NVLink4: busbw 450 GB/s x 0.80 = 360 GB/s; all-reduce moves 2 x 7/8 of 1 GB = 1.75 GB
    # -> 1.75 / 360 = 4.861 ms, + NCCL's Simple ring latency 8.4 us + 14 steps x 3.4 us = 4.917 ms
    # (LL128: 40.6 us but 0.92 of the bandwidth, 5.32 ms; NCCL takes the faster)
    t = comm.all_reduce_s(1 * GB, 8, "nvlink4")
    assert t == pytest.approx(1.75 / 360 + (8.4 + 14 * 3.4) * 1e-6, rel=1e-9)


def test_reduce_scatter_and_all_gather_are_half_an_all_reduce_in_bandwidth():
    # (n-1)/n each: on a large buffer the two together cost one all-reduce's bandwidth term
    big = 100 * GB
    rs, ag = comm.reduce_scatter_s(big, 4, "nvlink3"), comm.all_gather_s(big, 4, "nvlink3")
    ar = comm.all_reduce_s(big, 4, "nvlink3")
    # 0.75 x 100 GB / (300 x 0.8 GB/s) = 0.3125 s each
    assert rs == pytest.approx(0.3125 + (8.4 + 3 * 3.4) * 1e-6)
    assert rs + ag == pytest.approx(ar + 8.4e-6)  # one base latency more; the 6 steps are the all-reduce's


def test_one_rank_or_no_bytes_costs_nothing():
    assert comm.all_reduce_s(1 * GB, 1) == 0.0
    assert comm.all_gather_s(0, 8) == 0.0


def test_across_nodes_the_slower_link_bounds_the_ring():
    # 16 H100s in 2 nodes: NVLink4 360 GB/s vs 8 NICs x NDR 50 GB/s x 0.9 = 360 GB/s -> 360 GB/s; Simple's
    # latency: 8.4 us + 28 steps in a node x 3.4 us + 2 steps across x 14 us = 131.6 us
    t = comm.all_reduce_s(1 * GB, 16, "nvlink4")
    assert t == pytest.approx(2 * 15 / 16 / 360 + 131.6e-6)
    # one NIC per node: 45 GB/s
    t1 = comm.all_reduce_s(1 * GB, 16, "nvlink4", nics_per_node=1)
    assert t1 == pytest.approx(2 * 15 / 16 / 45 + 131.6e-6)
    # tree: log2(16) = 4 hops instead of 15
    tt = comm.all_reduce_s(1 * GB, 16, "nvlink4", algorithm="tree")
    assert tt == pytest.approx(2 * 15 / 16 / 360 + 25e-6 + 4e-6)


def test_nccl_ring_latency_grows_with_ranks_and_nodes_and_picks_the_faster_protocol():
    # a 1 KB all-gather on 8 NVLink ranks: LL, 6.6 us + 7 x 0.6 us (+ 1 KB at a third of 360 GB/s, at most
    # NCCL's llMaxBw of 87.7 GB/s on one Hopper node)
    assert comm.all_gather_s(1e3, 8, "nvlink4") == pytest.approx((6.6 + 7 * 0.6) * 1e-6 + 1e3 * 7 / 8 / 87.7e9)
    # 100 MB on 512 H100s (64 nodes): Simple would wait 8.4 + 448 x 3.4 + 63 x 14 = 2414 us; LL128 waits
    # 14 + 448 x 1.9 + 63 x 4 = 1117.2 us at 0.92 of 360 GB/s, and is faster
    t = comm.all_gather_s(100e6, 512, "nvlink4")
    assert t == pytest.approx(1117.2e-6 + 100e6 * 511 / 512 / (0.92 * 360e9))
    # PCIe has no LL128 (NCCL enables it by default on NVLink only): Simple for a large message
    assert comm.all_gather_s(1 * GB, 4, "pcie4") == pytest.approx((8.4 + 3 * 5.7) * 1e-6 + 0.75 / 19.84)
    # a link that is not NCCL's (gloo) keeps its own latency: base + 1 us a step
    gloo = comm.Link("gloo", 2 * GB, 1.0, 50e-6, "measured")
    assert comm.all_reduce_s(1 * GB, 4, gloo, gpus_per_node=4) == pytest.approx(50e-6 + 3e-6 + 1.5 / 2)


def test_pcie_is_slower_than_nvlink():
    # PCIe Gen4 32 GB/s x 0.62 = 19.84 GB/s busbw
    assert comm.get_link("pcie4").busbw_bytes_per_s == pytest.approx(19.84 * GB)
    assert comm.all_reduce_s(GB, 4, "pcie4") > 10 * comm.all_reduce_s(GB, 4, "nvlink3")


def test_gpu_links_from_the_catalog():
    assert comm.link_for_gpu("h100-sxm") == "nvlink4"
    assert comm.link_for_gpu("a100-80gb") == "nvlink3"
    assert comm.link_for_gpu("l4") == "pcie4"
    assert comm.network_for_link("nvlink4") == "ib-ndr"


def test_bad_input_is_an_error():
    with pytest.raises(GpuwiseError):
        comm.collective_s("alltoall", 1, 2)
    with pytest.raises(GpuwiseError):
        comm.all_reduce_s(1, 2, "carrier-pigeon")
    with pytest.raises(GpuwiseError):
        comm.all_reduce_s(1, 0)
