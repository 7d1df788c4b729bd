"""NCCL's communicator buffers in a data-parallel rank's device used (plan/memory/nccl.py): NCCL's own sizes,
which algorithms get connected, and the published per-process-group sizes."""

import pytest

from gpuwise.errors import GpuwiseError
from gpuwise.plan import estimate
from gpuwise.plan.memory import nccl
from gpuwise.plan.memory.split import Split, make_split

MIB = 2**20
WL, BATCH = "examples:mlp", 16


def test_a_connection_is_its_send_and_receive_sides_rounded_to_cuda_ipc_min_whether_p2p_writes_or_reads():
    """p2p.cc: write keeps the three protocols' buffers on the receive side, read (Ampere+ NVLink) moves Simple to
    the send side; each side a 4 KiB header and rounded up to 2 MiB: 12 MiB a peer either way."""
    ll, ll128, simple = nccl.LL_BUFFER, nccl.LL128_BUFFER, nccl.SIMPLE_BUFFER
    assert (ll, ll128, simple) == (MIB // 2, 4.6875 * MIB, 4 * MIB)
    read = nccl._aligned(nccl.HEADER + simple) + nccl._aligned(nccl.HEADER + ll + ll128)
    assert nccl.CONNECTION_BYTES == read == 12 * MIB


def test_lazy_connection_connects_rings_for_sharded_strategies_and_trees_too_for_all_reduce_or_across_nodes():
    a100 = "nvlink3"  # 24 channels within a node
    fsdp = nccl.buffer_bytes(Split("fsdp", 8), a100, "lazy")
    ddp = nccl.buffer_bytes(Split("ddp", 8), a100, "lazy")
    assert fsdp == 24 * 12 * MIB  # one ring connection a channel
    assert ddp == int(24 * (1 + 2 * 7 / 8) * 12 * MIB)  # + the tree's 2(n-1)/n edges a rank
    assert nccl.buffer_bytes(Split("fsdp", 8), a100, "eager") == ddp  # eager: rings and trees at once
    assert nccl.buffer_bytes(Split("zero2", 8), a100, "lazy") == fsdp
    # across nodes NCCL runs 16 channels, and a loop's small all-reduces (loss, gradient norm) connect the trees
    assert nccl.buffer_bytes(Split("fsdp", 16), "nvlink4", "lazy") == int(16 * (1 + 2 * 15 / 16) * 12 * MIB)
    # HSDP: a shard group within the node (rings) and a replica group across (rings and trees)
    hsdp = nccl.buffer_bytes(Split("hsdp", 16), "nvlink4", "lazy")
    assert hsdp == 24 * 12 * MIB + int(16 * (1 + 2 * 1 / 2) * 12 * MIB)
    assert nccl.buffer_bytes(Split("ddp", 2), "pcie4", "lazy") == 2 * 2 * 12 * MIB


def test_channels_within_a_node_are_nccls_topology_search_and_match_the_published_logs():
    """NCCL's ring search at its first speed, doubled by ncclTopoDupChannels and again by ncclTopoPostset: the
    counts NCCL logs. NVIDIA/nccl issue 1781: "24 coll channels" on two NVSwitch H100s (and vllm-project/vllm issue
    9699's 8 x H200 NVLS line, "buffSize 4194304 memSize 2097152 nvlsPerRankSize 301989888": NCCL 2.20's
    channels x 2 x (4 + 2) MiB, 24 channels); issue 1703: "2 CTAs per
    NVLink" on two A100s joined by 12 NVLinks; issue 713: the graph of four V100s joined by 2 NVLinks a pair
    (6 a GPU) has nchannels="6", which the post-set doubles. Across nodes 16, PCIe 2 (issue 689)."""
    assert nccl.channels("nvlink4", False) == 24  # floor(18 x 20.6 / 60) = 6 -> 12 -> 24; not 2 per NVLink's 36
    assert nccl.channels("nvlink3", False) == 2 * nccl.NVLINKS_PER_GPU["nvlink3"] == 24
    assert nccl.channels("nvlink2", False) == 2 * 6 == 12
    assert nccl.channels("nvlink5", False) == nccl.NCCL_MAX_CHANNELS  # 8 -> 16 -> 32
    assert nccl.channels("nvlink4", True) == 16 and nccl.channels("pcie4", False) == 2


def test_one_gpu_and_a_pipeline_hold_no_collective_buffers():
    assert nccl.buffer_bytes(Split(), "nvlink4") == 0
    assert nccl.buffer_bytes(make_split(4, "pipeline"), "nvlink4") == 0


def test_eager_connection_is_within_12_percent_of_the_published_process_group_sizes():
    """NVIDIA/nccl issue 964: 544 MB (2 GPUs) and 688 MB (4 GPUs) a process group on A100s, NCCL of 2022 (eager)."""
    for ranks, published in ((2, 544e6), (4, 688e6)):
        got = nccl.buffer_bytes(Split("ddp", ranks), "nvlink3", "eager")
        assert abs(got / published - 1) < 0.12, (ranks, got)


def test_the_connection_mode_comes_from_the_argument_then_nccl_runtime_connect():
    assert nccl.connect_mode(None, {}) == "lazy"
    assert nccl.connect_mode(None, {"NCCL_RUNTIME_CONNECT": "0"}) == "eager"
    assert nccl.connect_mode(None, {"NCCL_RUNTIME_CONNECT": "1"}) == "lazy"
    assert nccl.connect_mode("eager", {"NCCL_RUNTIME_CONNECT": "1"}) == "eager"
    with pytest.raises(GpuwiseError, match="lazy, eager"):
        nccl.connect_mode("sometimes")


def test_a_gpu_rank_counts_its_nccl_buffers_in_device_used_and_says_what_is_left_out():
    rank = estimate(WL, BATCH, gpu="H100", nproc=2, strategy="ddp", search_max_batch=False, nccl_connect="lazy")
    assert rank.overheads.nccl_bytes == 24 * 2 * 12 * MIB  # 24 channels on NVLink 4, a ring and a tree peer each
    assert rank.device_used_bytes == (rank.allocator.max_reserved_bytes + rank.overheads.context_bytes
                                      + rank.overheads.nccl_bytes)
    assert rank.to_dict()["overheads"]["nccl_bytes"] == rank.overheads.nccl_bytes
    note = next(n for n in rank.notes if "NCCL communicator buffers" in n)
    assert "576 MiB" in note and "NVLS" in note
    eager = estimate(WL, BATCH, gpu="H100", nproc=2, strategy="fsdp", search_max_batch=False, nccl_connect="eager")
    lazy = estimate(WL, BATCH, gpu="H100", nproc=2, strategy="fsdp", search_max_batch=False, nccl_connect="lazy")
    assert eager.device_used_bytes - lazy.device_used_bytes == 24 * 12 * MIB  # the tree
    one = estimate(WL, BATCH, gpu="H100", search_max_batch=False)
    assert one.overheads.nccl_bytes == 0 and not any("NCCL" in n for n in one.notes)
    cpu = estimate(WL, BATCH, target="cpu", nproc=2, strategy="ddp")
    assert not any("NCCL communicator" in n for n in cpu.notes)
