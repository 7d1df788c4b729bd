"""The NCCL collective model (plan/speed/comm.py): nccl-tests' busbw arithmetic, CPU only."""

import pytest

from gpuwise.errors import GpuwiseError
from gpuwise.plan.speed import comm

GB = 1e9


def test_all_reduce_ring_busbw_arithmetic():
    # 8 ranks on NVLink4: busbw 450 GB/s x 0.80 = 360 GB/s; all-reduce moves 2 x 7/8 of 1 GB = 1.75 GB
    # -> 1.75 / 360 = 4.861 ms, + 15 us base + 7 hops x 1 us = 4.883 ms
    t = comm.all_reduce_s(1 * GB, 8, "nvlink4")
    assert t == pytest.approx(1.75 / 360 + 15e-6 + 7e-6, rel=1e-9)


def test_reduce_scatter_and_all_gather_are_half_an_all_reduce_in_bandwidth():
    # (n-1)/n each: on a large buffer the two together cost one all-reduce's bandwidth term
    big = 100 * GB
    rs, ag = comm.reduce_scatter_s(big, 4, "nvlink3"), comm.all_gather_s(big, 4, "nvlink3")
    ar = comm.all_reduce_s(big, 4, "nvlink3")
    # 0.75 x 100 GB / (300 x 0.8 GB/s) = 0.3125 s each
    assert rs == pytest.approx(0.3125 + 15e-6 + 3e-6)
    assert rs + ag == pytest.approx(ar + 15e-6 + 3e-6)


def test_one_rank_or_no_bytes_costs_nothing():
    assert comm.all_reduce_s(1 * GB, 1) == 0.0
    assert comm.all_gather_s(0, 8) == 0.0


def test_across_nodes_the_slower_link_bounds_the_ring():
    # 16 H100s in 2 nodes: NVLink4 360 GB/s vs 8 NICs x NDR 50 GB/s x 0.9 = 360 GB/s -> 360 GB/s, 25 us
    t = comm.all_reduce_s(1 * GB, 16, "nvlink4")
    assert t == pytest.approx(2 * 15 / 16 / 360 + 25e-6 + 15e-6)
    # one NIC per node: 45 GB/s
    t1 = comm.all_reduce_s(1 * GB, 16, "nvlink4", nics_per_node=1)
    assert t1 == pytest.approx(2 * 15 / 16 / 45 + 25e-6 + 15e-6)
    # tree: log2(16) = 4 hops instead of 15
    tt = comm.all_reduce_s(1 * GB, 16, "nvlink4", algorithm="tree")
    assert tt == pytest.approx(2 * 15 / 16 / 360 + 25e-6 + 4e-6)


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
