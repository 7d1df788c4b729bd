"""The step-time model (plan/speed/): each mechanism's arithmetic on CPU, no timing."""

import pytest
import torch

from gpuwise.plan.catalog import lookup, speed_spec
from gpuwise.plan.speed import launch
from gpuwise.plan.speed.attention import attention_s
from gpuwise.plan.speed.batchnorm import BYTES_PER_S_PER_SM, CUDNN, NATIVE, NATIVE_CHANNELS_LAST
from gpuwise.plan.speed.conv import (
    DEPTHWISE_EFFICIENCY,
    DEPTHWISE_FP32_WEIGHT_GRAD_EFFICIENCY,
    FP32_CONV_EFFICIENCY,
    HALF_CONV_EFFICIENCY,
)
from gpuwise.plan.speed.gemm import gemm_s
from gpuwise.plan.speed.model import predict
from gpuwise.plan.speed.ops import OpCosts
from gpuwise.plan.speed.overlap import DDP_BUCKET_BYTES, comm_time

TF = 1e12


def test_gemm_full_waves_run_at_the_matmul_efficiency():
    # 132 SMs, 128x128 tiles: m = n = 128 x 132... take m = 128 x 12, n = 128 x 11 -> 132 tiles = 1 wave
    # time = 1 wave x 2 x 128 x 128 x 4096 / (1000 TF x 0.8 / 132) = 22.14 us; FLOPs 2 m n k / time = 800 TF
    m, n, k = 128 * 12, 128 * 11, 4096
    t = gemm_s(1, m, n, k, 2, 1000 * TF, 132, 0.8, 3e12)
    assert 2 * m * n * k / t == pytest.approx(800 * TF)


def test_gemm_wave_quantisation():
    # one tile more than the SMs: 133 tiles -> 2 waves, twice the time of 132 tiles
    # (bandwidth made huge so that only compute counts)
    one = gemm_s(1, 128 * 12, 128 * 11, 4096, 2, 1000 * TF, 132, 0.8, 1e18)
    two = gemm_s(1, 128 * 133, 128, 4096, 2, 1000 * TF, 132, 0.8, 1e18)
    assert two == pytest.approx(2 * one)


def test_gemm_tile_quantisation():
    # m = 129 costs two tile rows: as much as m = 256
    assert gemm_s(1, 129, 128, 8192, 2, 1000 * TF, 1, 0.8, 1e15) == gemm_s(1, 256, 128, 8192, 2, 1000 * TF, 1, 0.8, 1e15)


def test_skinny_gemm_is_memory_bound():
    # m = 1 (a matrix-vector product): 4096 x 4096 x 2 bytes of B read at 1 TB/s -> >= 33.5 us
    t = gemm_s(1, 1, 4096, 4096, 2, 1000 * TF, 132, 0.8, 1e12)
    assert t == pytest.approx((4096 + 4096 * 4096 + 4096) * 2 / 1e12)


def test_attention_kernel_fractions():
    # flash on Hopper at the H200's measured 31.3 % forward / 28.1 % backward of 1000 TF; efficient at 17.5 %
    assert attention_s(313 * TF, "flash", "forward", "hopper", 1000 * TF) == pytest.approx(1.0)
    assert attention_s(281 * TF, "flash", "backward", "hopper", 1000 * TF) == pytest.approx(1.0)
    assert attention_s(350 * TF, "efficient", "forward", "hopper", 1000 * TF) == pytest.approx(2.0)
    # Triton on Hopper keeps its ratios to FA2 there (/1.4 forward, /2 backward)
    assert attention_s(281 * TF, "triton", "backward", "hopper", 1000 * TF) == pytest.approx(2.0)
    # flash on Ampere: forward 70 %, backward 50 %
    assert attention_s(700 * TF, "flash", "forward", "ampere", 1000 * TF) == pytest.approx(1.0)
    assert attention_s(500 * TF, "flash", "backward", "ampere", 1000 * TF) == pytest.approx(1.0)
    # FlashAttention in Triton: FA2 is 1.3-1.5x faster forward (1.4 taken), 2x backward (FA2 paper sec. 4.1)
    assert attention_s(500 * TF, "triton", "forward", "ampere", 1000 * TF) == pytest.approx(1.0)
    assert attention_s(250 * TF, "triton", "backward", "ampere", 1000 * TF) == pytest.approx(1.0)


def test_relabel_attention_prices_flash_calls_as_another_kernel():
    c = OpCosts()
    c.attention[("forward", "flash")] = 10
    c.attention[("backward", "efficient")] = 3
    c.kernels["forward"] = 7
    r = c.relabel_attention("flash", "triton")
    assert dict(r.attention) == {("forward", "triton"): 10, ("backward", "efficient"): 3}
    assert r.kernels == c.kernels and c.attention[("forward", "flash")] == 10  # the original is untouched


def test_attention_fraction_follows_the_problem_shape():
    # at the reference (seq 8192, causal) a call runs at the table's fraction; shorter sequences pay the row-block
    # prologue more often, a 197-token sequence computes 256 x 256 (two 128-tiles each way) for 197 x 197
    from gpuwise.plan.speed.attention import REFERENCE, TILE, shape_factor

    ref = attention_s(590 * TF, "cudnn", "forward", "hopper", 1000 * TF, REFERENCE)
    assert ref == pytest.approx(attention_s(590 * TF, "cudnn", "forward", "hopper", 1000 * TF)) == pytest.approx(1.0)
    times = [attention_s(TF, "cudnn", "forward", "hopper", 1000 * TF, (s, s, True)) for s in (8192, 2048, 1024, 256)]
    assert times == sorted(times)  # per FLOP, shorter is slower
    assert shape_factor(197, 197, False, 0.0) == pytest.approx(197 * 197 / (2 * TILE) ** 2)
    # causal: 8 row-blocks of 128 compute 1 + 2 + ... + 8 = 36 tiles for 1024^2 / 2 (32 tiles) of work
    assert shape_factor(1024, 1024, True, 0.0) == pytest.approx(32 / 36)
    assert shape_factor(1024, 1024, True, 4.0) == pytest.approx(32 / 36 * 36 / (36 + 4 * 8))


def test_cudnn_attention_runs_first_on_sm90_sm100_from_torch_2_11():
    from gpuwise.plan.speed.attention import sdpa_kernel_on

    assert sdpa_kernel_on((9, 0), "2.11.0+cu130", env={})[0] == "cudnn"
    assert sdpa_kernel_on((10, 3), "2.13.0", env={})[0] == "cudnn"
    assert sdpa_kernel_on((9, 0), "2.9.1+cu128", env={})[0] == "flash"  # bundled cuDNN < 9.15.1
    assert sdpa_kernel_on((8, 0), "2.11.0", env={})[0] == "flash"
    assert sdpa_kernel_on((12, 0), "2.11.0", env={})[0] == "flash"
    assert sdpa_kernel_on((9, 0), "2.11.0", env={"TORCH_CUDNN_SDPA_DEPRIORITIZED": "1"})[0] == "flash"
    assert sdpa_kernel_on((9, 0), env={"GPUWISE_GPU_TORCH_VERSION": "2.6.0"})[0] == "flash"
    assert sdpa_kernel_on((9, 0), env={"GPUWISE_GPU_TORCH_VERSION": "2.11.0"})[0] == "cudnn"


def test_sdpa_calls_are_priced_by_shape_and_as_the_kernel_the_gpu_runs():
    from gpuwise.plan.speed.attention import as_gpu_runs

    c = OpCosts()
    for s, d in ((1024, 64), (256, 256)):
        q = torch.empty(2, 4, s, d, dtype=torch.bfloat16)
        c.record("aten._scaled_dot_product_flash_attention", "forward", (q, q, q), {"is_causal": True}, (q,), 1000)
    assert c.attention[("forward", "flash", 2)] == 1000
    assert c.attention_shapes == {("forward", "flash", 2, 1024, 1024, 64, True): 500,
                                  ("forward", "flash", 2, 256, 256, 256, True): 500}
    assert c.combine(c, 3).attention_shapes == c.attention_shapes and c.scaled(2).attention[("forward", "flash", 2)] == 2000
    # head dim 256 is beyond cuDNN's 128 there: stays flash
    r = c.relabel_attention("flash", "cudnn", max_head_dim=128)
    assert dict(r.attention) == {("forward", "flash", 2): 500, ("forward", "cudnn", 2): 500}
    assert set(r.attention_shapes) == {("forward", "cudnn", 2, 1024, 1024, 64, True),
                                       ("forward", "flash", 2, 256, 256, 256, True)}
    h200, a100 = lookup("h200"), lookup("a100-80gb")
    priced, why = as_gpu_runs(c, (9, 0))
    assert "cudnn" in why and priced.attention[("forward", "cudnn", 2)] == 500
    assert as_gpu_runs(c, (9, 0), attn="flash") == (c, None) and as_gpu_runs(c, (8, 0)) == (c, None)
    # priced per shape: the 256-token calls run further from the peak than the flat long-sequence fraction
    t = predict(c, a100, "bf16", samples_per_rank=1, flops_per_step=1).breakdown["attention"]
    flat = attention_s(1000, "flash", "forward", "ampere", a100.peak_flops("bf16"))
    assert t > flat
    assert predict(priced, h200, "bf16", samples_per_rank=1, flops_per_step=1).breakdown["attention"] > 0


def test_a_head_dim_without_its_own_kernel_is_computed_at_the_next_one():
    """FlashAttention-2 has kernels for head dims 32, 64, 96, 128, ... and runs 112 on 128's; Triton's
    FlashAttention pads to a power of two (Phi-2's 80 -> 128, where FA2 runs 96); cuDNN is priced as counted."""
    from gpuwise.plan.speed.attention import computed_head_dim

    assert [computed_head_dim("flash", d) for d in (64, 80, 112, 128, 200, 256)] == [64, 96, 128, 128, 224, 256]
    assert [computed_head_dim("triton", d) for d in (8, 64, 80, 112, 128)] == [16, 64, 128, 128, 128]
    assert computed_head_dim("cudnn", 112) == 112
    a100 = lookup("a100-80gb")

    def seconds(kernel, d):
        c = OpCosts()
        q = torch.empty(1, 8, 2048, d, dtype=torch.bfloat16)
        c.record("aten._scaled_dot_product_flash_attention", "forward", (q, q, q), {"is_causal": True}, (q,), 1000)
        c = c.relabel_attention("flash", kernel) if kernel != "flash" else c
        return predict(c, a100, "bf16", samples_per_rank=1, flops_per_step=1).breakdown["attention"]

    # the same FLOPs counted (1000 per call) at the same sequence: time in the ratio of the computed head dims
    assert seconds("flash", 112) / seconds("flash", 128) == pytest.approx(128 / 112)
    assert seconds("cudnn", 112) == pytest.approx(seconds("cudnn", 128))


def test_ddp_hides_all_but_the_last_bucket_behind_backward():
    # 1 GB of gradients on 8 x NVLink4: all-reduce ~4.9 ms < 100 ms of backward: only the last 25 MiB show
    plan = comm_time("ddp", 8, "nvlink4", 1e9, 5e8, 0.05, 0.1)
    from gpuwise.plan.speed.comm import all_reduce_s
    assert plan.exposed_s == pytest.approx(all_reduce_s(DDP_BUCKET_BYTES, 8, "nvlink4"))
    assert plan.total_s == pytest.approx(all_reduce_s(1e9, 8, "nvlink4"))
    # with no backward to hide behind, all of it shows (+ the last bucket again)
    assert comm_time("ddp", 8, "nvlink4", 1e9, 5e8, 0.0, 0.0).exposed_s > plan.total_s


def test_fsdp_exposes_one_block_each_way_when_compute_is_long():
    from gpuwise.plan.speed.comm import all_gather_s, reduce_scatter_s
    # one collective per block: 32 all-gathers of 2e9/32 bytes (forward and backward), 32 reduce-scatters
    ag, rs = all_gather_s(2e9 / 32, 8, "nvlink4"), reduce_scatter_s(4e9 / 32, 8, "nvlink4")
    plan = comm_time("fsdp", 8, "nvlink4", 4e9, 2e9, 10.0, 20.0, blocks=32)
    assert plan.exposed_s == pytest.approx(ag + rs)
    assert plan.total_s == pytest.approx(32 * (2 * ag + rs))


def test_fsdp_pays_a_collective_latency_per_block():
    from gpuwise.plan.speed.comm import all_gather_s, reduce_scatter_s
    # the bandwidth term is the same however the bytes are split; each of the 3 x 32 calls adds a latency
    one = comm_time("fsdp", 128, "nvlink4", 4e9, 2e9, 10.0, 20.0, blocks=1)
    many = comm_time("fsdp", 128, "nvlink4", 4e9, 2e9, 10.0, 20.0, blocks=32)
    ag, rs = all_gather_s(2e9 / 32, 128, "nvlink4"), reduce_scatter_s(4e9 / 32, 128, "nvlink4")
    assert many.total_s == pytest.approx(32 * (2 * ag + rs))
    assert many.total_s > one.total_s + 3 * 31 * 100e-6  # 16 nodes: each call waits hundreds of us


def test_hsdp_reduces_across_nodes_behind_backward_over_the_stated_network():
    from gpuwise.plan.speed.comm import all_reduce_s, node_network, reduce_scatter_s
    # 16 nodes; each of the 8 shard positions all-reduces its 0.5 GB shard across nodes
    kw = {"gpus_per_node": 1, "nics_per_node": 1}
    default = all_reduce_s(4e9 / 8, 16, "ib-ndr", network="ib-ndr", **kw)  # one 400 Gb/s NIC per GPU
    net = node_network(800 / 8)  # 800 Gb/s per node, shared by its 8 shard positions
    stated = all_reduce_s(4e9 / 8, 16, net, network=net, **kw)
    assert stated > 3 * default
    long = comm_time("hsdp", 128, "nvlink4", 4e9, 2e9, 10.0, 20.0, blocks=32)
    assert long.exposed_s < default  # behind a long backward only the last block's share waits
    short = comm_time("hsdp", 128, "nvlink4", 4e9, 2e9, 10.0, 0.01, blocks=32, network_gbps=800)
    # one reduce-scatter and one all-reduce across nodes per block
    rs = 32 * reduce_scatter_s(4e9 / 32, 8, "nvlink4")
    stated = 32 * all_reduce_s(4e9 / 8 / 32, 16, net, network=net, **kw)
    ag = comm_time("fsdp", 8, "nvlink4", 4e9, 2e9, 10.0, 20.0, blocks=32).total_s - rs
    assert short.total_s == pytest.approx(2 * ag / 2 + rs + stated)
    assert short.exposed_s > stated


def test_overlapped_collectives_slow_compute_by_the_sms_nccl_holds():
    from gpuwise.plan.speed.comm import nccl_sms
    assert (nccl_sms("nvlink3", False), nccl_sms("nvlink4", False), nccl_sms("pcie4", False)) == (24, 24, 2)
    assert nccl_sms("nvlink4", True) == 16
    free = comm_time("fsdp", 8, "nvlink4", 4e9, 2e9, 10.0, 20.0, blocks=32)
    held = comm_time("fsdp", 8, "nvlink4", 4e9, 2e9, 10.0, 20.0, blocks=32, sm_count=132)
    assert free.contention_s == 0 and held.exposed_s == free.exposed_s
    # every collective overlaps (compute is long): 24 of 132 SMs busy for the collectives' whole time
    assert held.contention_s == pytest.approx(24 / 132 * held.total_s)


def test_fsdp_gathers_every_micro_batch_and_reduces_once_per_step():
    from gpuwise.plan.speed.comm import all_gather_s, reduce_scatter_s
    ag, rs = all_gather_s(2e9 / 32, 8, "nvlink4"), reduce_scatter_s(4e9 / 32, 8, "nvlink4")
    four = comm_time("fsdp", 8, "nvlink4", 4e9, 2e9, 10.0, 20.0, blocks=32, micro_steps=4)
    assert four.total_s == pytest.approx(32 * (4 * 2 * ag + rs))
    assert four.exposed_s == pytest.approx(4 * ag + rs)
    ddp = comm_time("ddp", 8, "nvlink4", 4e9, 2e9, 10.0, 20.0)
    assert comm_time("ddp", 8, "nvlink4", 4e9, 2e9, 10.0, 20.0, micro_steps=4) == ddp


def test_syncing_every_micro_batch_reduces_every_micro_batch_and_waits_for_each_last_reduction():
    # --accum-sync every (Composer under FSDP: no no_sync): 4 micro-batches, 4 reduce-scatters of every unit,
    # each micro-batch's last one exposed; DDP likewise all-reduces every micro-batch
    from gpuwise.plan.speed.comm import all_gather_s, all_reduce_s, reduce_scatter_s
    ag, rs = all_gather_s(2e9 / 32, 8, "nvlink4"), reduce_scatter_s(4e9 / 32, 8, "nvlink4")
    every = comm_time("fsdp", 8, "nvlink4", 4e9, 2e9, 10.0, 20.0, blocks=32, micro_steps=4, sync_every=True)
    assert every.total_s == pytest.approx(32 * 4 * (2 * ag + rs))
    assert every.exposed_s == pytest.approx(4 * ag + 4 * rs)
    assert comm_time("fsdp", 8, "nvlink4", 4e9, 2e9, 10.0, 20.0, blocks=32, sync_every=True) == \
        comm_time("fsdp", 8, "nvlink4", 4e9, 2e9, 10.0, 20.0, blocks=32)  # one micro-batch: nothing changes
    ddp = comm_time("ddp", 8, "nvlink4", 4e9, 2e9, 10.0, 20.0, micro_steps=4, sync_every=True)
    assert ddp.total_s == pytest.approx(4 * all_reduce_s(4e9, 8, "nvlink4"))
    assert ddp.exposed_s == pytest.approx(4 * all_reduce_s(DDP_BUCKET_BYTES, 8, "nvlink4"))


def test_the_speed_breakdown_prices_a_reduction_per_micro_batch():
    c = OpCosts()
    c.gemms[("forward", 1, 4096, 4096, 4096, 2)] = 400
    c.gemms[("backward", 1, 4096, 4096, 4096, 2)] = 800
    gpu = lookup("H100")
    kw = dict(samples_per_rank=8, flops_per_step=1e15, nproc=64, strategy="fsdp", grad_bytes=4e10, param_bytes=2e10,
              blocks=32, micro_steps=8)
    last, every = predict(c, gpu, "bf16", **kw), predict(c, gpu, "bf16", **kw, sync_every=True)
    assert every.breakdown["communication"] > last.breakdown["communication"]
    assert every.step_time_s - last.step_time_s == pytest.approx(
        every.breakdown["communication"] - last.breakdown["communication"])
    assert {k: v for k, v in every.breakdown.items() if k != "communication"} == \
        {k: v for k, v in last.breakdown.items() if k != "communication"}


def test_host_bound_step_when_the_gpu_outruns_python():
    # 10 000 aten ops x 4 us = 40 ms of host dispatch; 1000 tiny kernels on the GPU are far less
    c = OpCosts()
    c.host_ops["forward"] = 10_000
    c.kernels["forward"] = 1000
    c.memory_bytes["forward"] = 1e6
    s = predict(c, lookup("h100"), "bf16", samples_per_rank=1, flops_per_step=0)
    assert s.step_time_s == pytest.approx(launch.host_s(10_000) + launch.HOST_STEP_S)
    assert s.bound_by == "launch_overhead"


def test_host_and_gpu_take_turns_phase_by_phase():
    # the step ends in a sync, so the host cannot run ahead into the next step: a host-bound forward/backward
    # followed by a GPU-bound optimizer costs host(forward, backward) + GPU(optimizer), more than max(host, GPU)
    gpu = {"forward": 1e-3, "backward": 2e-3, "optimizer": 10e-3}
    host = {"forward": 5e-3, "backward": 5e-3, "optimizer": 1e-3}
    assert launch.step_s(gpu, host) == pytest.approx(10e-3 + 10e-3)
    assert launch.step_s(gpu, host, start_s=1e-3) == pytest.approx(1e-3 + 20e-3)
    # GPU-bound throughout: the host hides behind the kernels
    assert launch.step_s(gpu, {p: 1e-4 for p in gpu}) == pytest.approx(13e-3)
    # the step's fixed Python lands with the optimizer; a convolution costs its cuDNN set-up on top of its dispatch
    host = launch.host_phases_s({"forward": 10, "zero_grad": 2}, {"backward": 4})
    assert host["forward"] == pytest.approx(10 * launch.HOST_PER_OP_S)
    assert host["backward"] == pytest.approx(4 * launch.HOST_PER_CONV_S)
    assert host["optimizer"] == pytest.approx(2 * launch.HOST_PER_OP_S + launch.HOST_STEP_S)


def test_predict_sums_phases_and_reports_mfu():
    # one forward GEMM 1 wave on H100 (132 SMs, sustained 0.716 of 989.5 TF) + 10 GB memory-bound at 0.9 x 3.35 TB/s
    # (3.3 ms: longer than the host's fixed part, launch.py HOST_STEP_S)
    gpu = lookup("h100")
    sp = speed_spec(gpu)
    c = OpCosts()
    c.gemms[("forward", 1, 128 * 12, 128 * 11, 8192, 2)] = 1
    c.memory_bytes["backward"] = 1e10
    s = predict(c, gpu, "bf16", samples_per_rank=4, flops_per_step=2 * 128 * 12 * 128 * 11 * 8192, tokens_per_sample=10)
    matmul = 2 * 128 * 128 * 8192 * 132 / (989.5e12 * sp.gemm_efficiency(2))
    memory = 1e10 / (3350e9 * 0.9)
    assert s.breakdown["matmul"] == pytest.approx(matmul)
    assert s.breakdown["memory_bound"] == pytest.approx(memory)
    assert s.step_time_s == pytest.approx(matmul + memory)
    assert s.bound_by == "memory_bound"
    assert s.tokens_per_s_per_gpu == pytest.approx(40 / s.step_time_s)
    assert s.mfu == pytest.approx(2 * 128 * 12 * 128 * 11 * 8192 / (s.step_time_s * 989.5e12))


def test_16_bit_gemms_run_at_the_sustained_fraction_where_one_is_published():
    # MSMF (power-saturated, settled clock) for bf16/fp16 GEMMs on the GPUs it is published for (the H200, the
    # B200) and their same-die parts; 4-byte GEMMs and GPUs without one keep the best-shape MAMF
    from gpuwise.plan.catalog import MAMF, MSMF

    assert speed_spec(lookup("h200")).gemm_efficiency(2) == MSMF["h200"] == 0.716
    assert speed_spec(lookup("h100")).gemm_efficiency(2) == MSMF["h200"]
    assert speed_spec(lookup("h100")).gemm_efficiency(4) == MAMF["h100-sxm"]
    assert speed_spec(lookup("b200")).gemm_efficiency(2) == MSMF["b200"] < MAMF["b200"]
    assert speed_spec(lookup("a100-80gb")).gemm_efficiency(2) == MAMF["a100-sxm"]
    c = OpCosts()  # one full wave of 128 x 128 tiles on the H100's 132 SMs each
    c.gemms[("forward", 1, 128 * 12, 128 * 11, 8192, 2)] = 1
    c.gemms[("forward", 1, 128 * 12, 128 * 11, 8192, 4)] = 1
    s = predict(c, lookup("h100"), "tf32", samples_per_rank=1, flops_per_step=1)  # TF32 for the 4-byte one
    flops = 2 * 128 * 12 * 128 * 11 * 8192
    assert s.breakdown["matmul"] == pytest.approx(flops / (989.5e12 * MSMF["h200"]) + flops / (494.5e12 * MAMF["h100-sxm"]))
    assert any(n.startswith("16-bit GEMMs at the sustained matmul rate, 71.6% of peak") for n in s.notes)
    c.gemms.pop(("forward", 1, 128 * 12, 128 * 11, 8192, 2))  # fp32 GEMMs alone, or an A100: no such note
    for gpu in ("h100", "a100-80gb"):
        assert not any("sustained" in n for n in predict(c, lookup(gpu), "tf32", samples_per_rank=1, flops_per_step=1).notes)


def test_op_costs_record_and_extrapolate():
    c = OpCosts()
    a, b = torch.empty(64, 32), torch.empty(32, 16)
    c.record("aten.mm", "forward", (a, b), {}, torch.empty(64, 16), 2 * 64 * 32 * 16)
    c.record("aten.t", "forward", (a,), {}, a.t(), 0)  # a view: no kernel, no bytes
    c.record("aten.add", "forward", (a, a), {}, torch.empty(64, 32), 0)
    assert c.gemms == {("forward", 1, 64, 16, 32, 4, True): 1}
    assert c.memory_bytes["forward"] == 3 * 64 * 32 * 4   # two reads + one write
    assert c.kernels["forward"] == 2 and c.host_ops["forward"] == 3
    d = OpCosts()
    d.gemms[("forward", 1, 64, 16, 32, 4, True)] = 2
    # 3 traced blocks -> 1 call, 4 -> 2: 32 blocks -> 1 + 29 x 1 = 30
    assert c.combine(d, 29).gemms[("forward", 1, 64, 16, 32, 4, True)] == 30
    assert c.scaled(4).kernels["forward"] == 8


def test_indexing_kernels_read_only_the_elements_they_pick():
    """A gather reads as many elements of its source as it writes; nll_loss one log-probability per target row;
    its backward none (it scatters into a zero-filled grad_input). Priced by whole operands, cross-entropy's
    nll_loss would read the batch x vocabulary log-probabilities twice more than the kernels do."""
    rows, vocab = 512, 1000
    logp = torch.randn(rows, vocab).log_softmax(-1)
    target = torch.randint(0, vocab, (rows,))
    c = OpCosts()
    loss = torch.ops.aten.nll_loss_forward(logp, target, None, 2, -100)
    c.record("aten.nll_loss_forward", "forward", (logp, target, None, 2, -100), {}, loss, 0)
    assert c.memory_bytes["forward"] == rows * 8 + rows * 4 + 2 * 4  # targets, picked rows, loss and total weight
    grad = torch.ops.aten.nll_loss_backward(torch.ones(()), logp, target, None, 2, -100, loss[1])
    c.record("aten.nll_loss_backward", "backward", (torch.ones(()), logp, target, None, 2, -100, loss[1]), {}, grad, 0)
    assert c.memory_bytes["backward"] == 4 + rows * 8 + 4 + rows * vocab * 4  # no read of logp: the write only
    table, idx = torch.randn(vocab, 64), torch.randint(0, vocab, (rows,))
    d = OpCosts()
    d.record("aten.index_select", "forward", (table, 0, idx), {}, table[idx], 0)
    assert d.memory_bytes["forward"] == 2 * rows * 64 * 4 + rows * 8


def test_metadata_ops_and_causal_attention():
    # prim.device and other ops without a tensor output move no bytes; a causal SDPA counts half its FLOPs
    c = OpCosts()
    a = torch.empty(64, 32)
    c.record("prim.device", "forward", (a,), {}, torch.device("cpu"), 0)
    c.record("aten.is_same_size", "forward", (a, a), {}, True, 0)
    assert c.memory_bytes["forward"] == 0 and c.kernels["forward"] == 0
    c.record("aten._scaled_dot_product_flash_attention", "forward", (a, a, a), {"is_causal": True}, (a,), 1000)
    c.record("aten._scaled_dot_product_flash_attention", "forward", (a, a, a), {"is_causal": False}, (a,), 1000)
    assert c.attention[("forward", "flash", 4)] == 500 + 1000


def test_gemm_with_an_unaligned_leading_dimension_runs_the_slow_fallback():
    # GPT-2's LM head, vocab 50257: the bf16 output's rows are 50257 x 2 bytes apart, not a multiple of 16 ->
    # cuBLAS's align1 kernels (gemm.py MISALIGNED_EFFICIENCY); vocab 50304 (nanoGPT's padding) stays aligned
    from gpuwise.plan.speed.gemm import MISALIGNED_EFFICIENCY

    x = torch.empty(64, 768, dtype=torch.bfloat16)
    for vocab, aligned in ((50257, False), (50304, True)):
        c = OpCosts()
        w = torch.empty(vocab, 768, dtype=torch.bfloat16)
        c.record("aten.mm", "forward", (x, w.t()), {}, torch.empty(64, vocab, dtype=torch.bfloat16), 0)
        assert c.gemms == {("forward", 1, 64, vocab, 768, 2, aligned): 1}
    fast = gemm_s(1, 8192, 50304, 768, 2, 989.5e12, 132, 0.83, 4e12)
    slow = gemm_s(1, 8192, 50257, 768, 2, 989.5e12, 132, 0.83, 4e12, aligned=False)
    assert slow == pytest.approx(fast * 0.83 / MISALIGNED_EFFICIENCY, rel=0.01)
    # fp32 GEMMs run on CUDA cores either way: no fallback price
    assert gemm_s(1, 8192, 50257, 768, 4, 67e12, 132, 0.83, 4e12, aligned=False) == \
        gemm_s(1, 8192, 50257, 768, 4, 67e12, 132, 0.83, 4e12)


def test_fp32_fused_attention_runs_at_the_3xtf32_peak():
    # SDPA in fp32 runs the memory-efficient kernel, whose GEMMs are 3xTF32 on sm80+ (attention.py)
    from gpuwise.plan.speed.attention import attention_peak

    h200, v100 = lookup("h200"), lookup("v100-32gb")
    assert attention_peak(h200, 2, 989.5e12) == 989.5e12
    assert attention_peak(h200, 4, 989.5e12) == pytest.approx(494.5e12 / 3)
    assert attention_peak(v100, 4, 125e12) == v100.peak_flops("fp32")
    times = {}
    for dtype in (torch.float32, torch.bfloat16):
        c = OpCosts()
        q = torch.empty(2, 4, 16, 8, dtype=dtype)
        c.record("aten._scaled_dot_product_efficient_attention", "forward", (q, q, q), {}, (q,), 1e12)
        assert set(c.attention) == {("forward", "efficient", q.element_size())}
        assert set(c.relabel_attention("efficient", "flash").attention) == {("forward", "flash", q.element_size())}
        times[dtype] = predict(c, h200, "bf16", samples_per_rank=1, flops_per_step=1e12).breakdown["attention"]
    assert times[torch.float32] / times[torch.bfloat16] == pytest.approx(989.5 / (494.5 / 3))


def test_sharded_optimizer_runs_on_one_shard():
    # FSDP over 8 ranks: each rank's optimizer touches 1/8 of the bytes
    c = OpCosts()
    c.memory_bytes["optimizer"] = 8e9
    gpu = lookup("h100")
    one = predict(c, gpu, "bf16", samples_per_rank=1, flops_per_step=0)
    eight = predict(c, gpu, "bf16", samples_per_rank=1, flops_per_step=0, nproc=8, strategy="fsdp")
    assert eight.breakdown["optimizer"] == pytest.approx(one.breakdown["optimizer"] / 8)


def test_selective_recompute_parts():
    from gpuwise.plan.speed.model import recompute_parts
    fwd = {"matmul": 4.0, "attention": 2.0, "memory_bound": 1.0, "launch_overhead": 0.5}
    # per-op SAC: every second mm recomputed (half the matmuls), all non-saved ops; attention saved
    assert recompute_parts(fwd, "op") == {"matmul": 2.0, "memory_bound": 1.0, "launch_overhead": 0.5}
    # every 2nd block checkpointed: half the forward again
    assert recompute_parts(fwd, "2") == {"matmul": 2.0, "attention": 1.0, "memory_bound": 0.5, "launch_overhead": 0.25}
    assert recompute_parts(fwd, None) == {}


def _conv_costs(x: torch.Tensor, w: torch.Tensor) -> OpCosts:
    out = torch.nn.functional.conv2d(x, w, padding=w.shape[-1] // 2)
    c = OpCosts()
    c.record("aten.convolution", "forward", (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), {}, out,
             2 * out.numel() * w[0].numel())
    return c


def test_a_convolution_is_priced_as_an_implicit_gemm_with_its_layout_transposes():
    x, w = torch.randn(8, 64, 56, 56, dtype=torch.bfloat16), torch.randn(64, 64, 1, 1, dtype=torch.bfloat16)
    [(key, calls)] = _conv_costs(x, w).convs.items()
    phase, flops, nbytes, nchw_bytes, itemsize = key
    assert (phase, calls, itemsize) == ("forward", 1, 2)
    assert nbytes == 2 * x.nbytes + w.nbytes      # input + weight + output (same shape as the input here)
    assert nchw_bytes == 2 * x.nbytes             # channels-first: input and output are transposed for cuDNN
    # channels_last: nothing to transpose
    [key_cl] = _conv_costs(x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)).convs
    assert key_cl[3] == 0 and key_cl[2] == nbytes
    h100 = lookup("h100-sxm")
    nchw = predict(_conv_costs(x, w), h100, "bf16", samples_per_rank=8, flops_per_step=flops)
    nhwc = predict(_conv_costs(x.to(memory_format=torch.channels_last), w), h100, "bf16", samples_per_rank=8,
                   flops_per_step=flops)
    # a 1x1 convolution of 64 channels is memory-bound (64 MACs per 4 bytes moved), and the transposes
    # read and write its activations once more: 2 x 6.4 MB at 90 % of 3.35 TB/s each way
    bw = h100.bandwidth_bytes_per_s * speed_spec(h100).memory_efficiency
    assert nhwc.breakdown["matmul"] == pytest.approx(nbytes / bw)
    assert nchw.breakdown["matmul"] == pytest.approx((nbytes + 2 * nchw_bytes) / bw)


def test_4_byte_convolutions_use_tf32_only_under_precision_tf32():
    # gpuwise's fp32 step turns cuDNN's TF32 off (step.tf32_mode): the fp32 rate, no tensor cores, so no
    # layout transposes either; --precision tf32 turns it on: the TF32 rate, and the transposes
    x, w = torch.randn(8, 64, 56, 56), torch.randn(64, 64, 3, 3)
    c = _conv_costs(x, w)
    [(_, flops, nbytes, nchw_bytes, _)] = c.convs
    a100 = lookup("a100-80gb")
    eff, bw = speed_spec(a100).matmul_efficiency, a100.bandwidth_bytes_per_s * speed_spec(a100).memory_efficiency
    fp32 = predict(c, a100, "fp32", samples_per_rank=8, flops_per_step=flops).breakdown["matmul"]
    tf32 = predict(c, a100, "tf32", samples_per_rank=8, flops_per_step=flops).breakdown["matmul"]
    assert fp32 == pytest.approx(max(flops / (a100.flops["fp32"] * eff), nbytes / bw))
    assert tf32 == pytest.approx(max(flops / (a100.flops["tf32"] * eff), nbytes / bw) + 2 * nchw_bytes / bw)


def test_a_power_limited_h100_is_priced_at_its_limit_and_bandwidth():
    # torchtitan's Grand Teton H100: 96GB HBM2e at 2.4 TB/s, 500 W. Its peak lies between the H100 NVL (400 W,
    # 835.5 bf16 TF) and SXM (700 W, 989.5) datasheet points, linear in the limit: 835.5 + 154 x 100/300
    from gpuwise.plan.catalog import power_limited

    grand_teton, sxm = lookup("H100-SXM-500W"), lookup("h100")
    assert grand_teton.peak_flops("bf16") == pytest.approx((835.5 + 154 / 3) * TF)
    assert grand_teton.bandwidth_bytes_per_s == 2400e9
    assert power_limited(835.5, 400, 989.5, 700, 700) == 989.5
    with pytest.raises(ValueError):
        power_limited(835.5, 400, 989.5, 700, 800)
    c = OpCosts()
    c.gemms[("forward", 1, 4096, 4096, 4096, 2)] = 1
    c.memory_bytes["forward"] = 1e9
    fast = predict(c, sxm, "bf16", samples_per_rank=1, flops_per_step=2 * 4096**3)
    slow = predict(c, grand_teton, "bf16", samples_per_rank=1, flops_per_step=2 * 4096**3)
    assert slow.breakdown["matmul"] == pytest.approx(fast.breakdown["matmul"] * 989.5 / (835.5 + 154 / 3))
    assert slow.breakdown["memory_bound"] == pytest.approx(fast.breakdown["memory_bound"] * 3350 / 2400)


def test_gpu_all_lists_products_not_named_configurations():
    from gpuwise.plan.catalog import CATALOG

    assert not CATALOG["h100-sxm-500w"].listed and CATALOG["h100-sxm"].listed


def test_memory_bound_ops_are_priced_on_the_loop_torch_runs():
    # TensorIterator: same-dtype contiguous -> vectorised; bf16 + fp32 -> unrolled (dynamic casting); a broadcast
    # operand -> strided; fp32 -> bf16 copy has its own vectorised kernel; _foreach_ -> multi_tensor_apply
    from gpuwise.plan.speed.memory_bound import PATH_EFFICIENCY, memory_bound_s

    aten = torch.ops.aten
    x32, x16 = torch.empty(64, 32), torch.empty(64, 32, dtype=torch.bfloat16)
    c = OpCosts()
    c.record("aten.add", "forward", (x32, x32), {}, torch.empty(64, 32), 0, aten.add.Tensor)
    c.record("aten.add", "forward", (x16, x32), {}, torch.empty(64, 32), 0, aten.add.Tensor)
    c.record("aten.mul", "forward", (x32, torch.empty(32)), {}, torch.empty(64, 32), 0, aten.mul.Tensor)
    c.record("aten._to_copy", "forward", (x32,), {}, torch.empty(64, 32, dtype=torch.bfloat16), 0,
             aten._to_copy.default)
    c.record("aten._to_copy", "forward", (x16,), {}, torch.empty(64, 32), 0, aten._to_copy.default)
    c.record("aten._foreach_add_", "optimizer", ([x32, x32], [x32, x32]), {}, None, 0)
    n32, n16 = 64 * 32 * 4, 64 * 32 * 2
    assert c.memory_bytes == {"forward": 3 * n32 + n32 + n16,
                              ("forward", "unrolled"): 2 * n32 + n16 + n16 + n32,
                              ("forward", "strided"): 2 * n32 + 32 * 4,
                              ("optimizer", "foreach"): 4 * n32}
    assert c.scaled(2).memory_bytes[("forward", "strided")] == 2 * (2 * n32 + 32 * 4)
    assert memory_bound_s(1e9, 4.8e12, 0.9, "unrolled") == pytest.approx(1e9 / (4.8e12 * PATH_EFFICIENCY["unrolled"]))
    assert memory_bound_s(1e9, 4.8e12, 0.9) == pytest.approx(1e9 / (4.8e12 * 0.9))
    s = predict(c, lookup("h200"), "bf16", samples_per_rank=1, flops_per_step=1)
    slow = sum(memory_bound_s(v, 4.8e12, 0.9, k[1]) for k, v in c.memory_bytes.items()
               if isinstance(k, tuple) and k[0] == "forward")
    assert s.breakdown["memory_bound"] == pytest.approx(memory_bound_s(c.memory_bytes["forward"], 4.8e12, 0.9) + slow)


def test_fp32_convolutions_on_hopper_run_at_the_fraction_cudnns_ffma_kernels_reached():
    # Hopper's fp32 convs ran sm80 FFMA builds at 0.403 of the fp32 peak; a V100 keeps the matmul efficiency
    x, w = torch.randn(8, 64, 56, 56), torch.randn(64, 64, 3, 3)
    c = _conv_costs(x, w)
    [(_, flops, nbytes, _, _)] = c.convs
    for name, eff in (("h200", FP32_CONV_EFFICIENCY["hopper"]), ("v100-32gb", None)):
        gpu = lookup(name)
        eff = eff or speed_spec(gpu).matmul_efficiency
        bw = gpu.bandwidth_bytes_per_s * speed_spec(gpu).memory_efficiency
        fp32 = predict(c, gpu, "fp32", samples_per_rank=8, flops_per_step=flops).breakdown["matmul"]
        assert fp32 == pytest.approx(max(flops / (gpu.flops["fp32"] * eff), nbytes / bw))


def test_bf16_convolutions_on_hopper_run_at_the_fraction_cudnns_sm90_kernels_reached():
    # ResNet-50's bf16 convs reached 0.281 of the H200's bf16 peak (its layout transposes apart); an A100
    # keeps the matmul efficiency, and a B200 the sustained one its bf16 GEMMs take (MSMF, below its MAMF)
    from gpuwise.plan.catalog import MAMF, MSMF

    x, w = torch.randn(64, 256, 28, 28, dtype=torch.bfloat16), torch.randn(256, 256, 3, 3, dtype=torch.bfloat16)
    c = _conv_costs(x.to(memory_format=torch.channels_last), w)
    [(_, flops, nbytes, _, _)] = c.convs
    for name, eff in (("h200", HALF_CONV_EFFICIENCY["hopper"]), ("a100-80gb", MAMF["a100-sxm"]),
                      ("b200", MSMF["b200"])):
        gpu = lookup(name)
        bw = gpu.bandwidth_bytes_per_s * speed_spec(gpu).memory_efficiency
        bf16 = predict(c, gpu, "bf16", samples_per_rank=64, flops_per_step=flops).breakdown["matmul"]
        assert bf16 == pytest.approx(max(flops / (gpu.flops["bf16"] * eff), nbytes / bw))


def test_a_grouped_convolution_backward_counts_its_groups():
    # torch's flop formula counts a grouped convolution's grad_input as if dense (C / groups times too many
    # FLOPs); each of grad_input and grad_weight costs the forward's FLOPs
    x, w = torch.randn(2, 96, 14, 14), torch.randn(96, 4, 7, 7)
    out = torch.nn.functional.conv2d(x, w, padding=3, groups=24)
    forward = 2 * out.numel() * w[0].numel()
    c = OpCosts()
    args = (out, x, w, None, [1, 1], [3, 3], [1, 1], False, [0, 0], 24, [True, True, False])
    c.record("aten.convolution_backward", "backward", args, {}, (x, w, None), 24 * forward)
    c.record("aten.convolution_backward", "backward", args[:-1] + ([False, True, False],), {}, (None, w, None), 1)
    assert sorted(k[1] for k in c.convs) == [forward, 2 * forward]


def test_a_depthwise_convolution_is_priced_per_kernel_on_the_cuda_cores():
    # no GEMM to speak of (49 taps): cuDNN's direct kernels at a measured fraction of the fp32 peak, one key per
    # kernel (forward; backward data and weight gradients), the fp32 weight gradient's kernel far slower
    x, w = torch.randn(32, 96, 56, 56), torch.randn(96, 1, 7, 7)
    out = torch.nn.functional.conv2d(x, w, padding=3, groups=96)
    forward = 2 * out.numel() * w[0].numel()
    h200 = lookup("h200")
    for dtype in (torch.float32, torch.bfloat16):
        xs, ws, outs = x.to(dtype), w.to(dtype), out.to(dtype)
        c = OpCosts()
        c.record("aten.convolution", "forward", (xs, ws, None, [1, 1], [3, 3], [1, 1], False, [0, 0], 96), {}, outs,
                 forward)
        c.record("aten.convolution_backward", "backward",
                 (outs, xs, ws, None, [1, 1], [3, 3], [1, 1], False, [0, 0], 96, [True, True, False]), {},
                 (xs, ws, None), 97 * forward)
        assert not c.convs and c.kernels == {"forward": 1, "backward": 2}
        size = xs.element_size()
        assert c.depthwise == {("forward", "forward", forward, 2 * xs.nbytes + ws.nbytes, size): 1,
                               ("backward", "data", forward, 2 * xs.nbytes + ws.nbytes, size): 1,
                               ("backward", "weight", forward, 2 * xs.nbytes + ws.nbytes, size): 1}
        s = predict(c, h200, "bf16" if size == 2 else "fp32", samples_per_rank=32, flops_per_step=3 * forward)
        rate = h200.flops["fp32"] * DEPTHWISE_EFFICIENCY[size]
        weight = forward / (h200.flops["fp32"] * DEPTHWISE_FP32_WEIGHT_GRAD_EFFICIENCY) if size == 4 else forward / rate
        assert s.breakdown["matmul"] == pytest.approx(2 * forward / rate + weight)
    # one input channel (a first layer on grey images) is a dense convolution, not a depthwise one
    grey, w1 = torch.randn(8, 1, 28, 28), torch.randn(6, 1, 5, 5)
    c = _conv_costs(grey, w1)
    assert len(c.convs) == 1 and not c.depthwise


def test_a_convolution_bias_is_its_own_kernel_inside_the_op():
    # cuDNN convolves without the bias: ATen adds it after (a broadcast add_, the strided loop) and sums
    # grad_output for its gradient, inside aten.convolution / convolution_backward, so the trace never sees them
    x, w, b = torch.randn(8, 64, 28, 28), torch.randn(64, 64, 3, 3), torch.randn(64)
    out = torch.nn.functional.conv2d(x, w, b, padding=1)
    c = OpCosts()
    c.record("aten.convolution", "forward", (x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), {}, out, 1)
    c.record("aten.convolution_backward", "backward",
             (out, x, w, [64], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True]), {}, (x, w, b), 1)
    assert c.memory_bytes == {("forward", "strided"): 2 * out.nbytes + b.nbytes, "backward": out.nbytes + b.nbytes}
    assert c.kernels == {"forward": 2, "backward": 2}
    c = _conv_costs(x, w)  # no bias, no kernel
    assert not c.memory_bytes and c.kernels == {"forward": 1}


def _batch_norm(c: OpCosts, x: torch.Tensor, weight_dtype=torch.float32) -> None:
    w = torch.ones(x.shape[1], dtype=weight_dtype)
    stats = torch.zeros(x.shape[1])
    c.record("aten.native_batch_norm", "forward", (x, w, w, stats, stats, True, 0.1, 1e-5), {},
             (torch.empty_like(x), stats, stats), 0)
    c.record("aten.native_batch_norm_backward", "backward",
             (x, x, w, stats, stats, stats, stats, True, 1e-5, [True, True, True]), {}, (x, w, w), 0)


def test_batch_norm_is_priced_by_its_passes_at_the_bandwidth_its_kernels_reach():
    # training: 3 passes over x forward (statistics; normalise), 5 backward (two sums; grad_input)
    x = torch.randn(8, 64, 28, 28, dtype=torch.bfloat16)
    bf16 = OpCosts()
    _batch_norm(bf16, x)  # bf16 activations, fp32 weights (autocast): PyTorch's own kernels, not cuDNN's
    assert bf16.batch_norms == {("forward", NATIVE): 3 * x.nbytes, ("backward", NATIVE): 5 * x.nbytes}
    assert bf16.memory_bytes["forward"] == bf16.memory_bytes["backward"] == 0
    fp32 = OpCosts()
    _batch_norm(fp32, x.float())
    assert set(fp32.batch_norms) == {("forward", CUDNN), ("backward", CUDNN)}
    cl = OpCosts()
    _batch_norm(cl, x.to(memory_format=torch.channels_last))
    assert set(cl.batch_norms) == {("forward", NATIVE_CHANNELS_LAST), ("backward", NATIVE_CHANNELS_LAST)}
    h200, h100 = lookup("h200"), lookup("h100")
    s = predict(bf16, h200, "bf16", samples_per_rank=8, flops_per_step=0)
    assert s.breakdown["batch_norm"] == pytest.approx(8 * x.nbytes / (132 * BYTES_PER_S_PER_SM[NATIVE]))
    # far below a streaming kernel's 90 %: one thread block per channel; bound by the SMs, not by HBM, so an
    # H100 SXM (same 132 SMs, 3.35 TB/s) takes as long as the H200 (4.8 TB/s)
    assert s.breakdown["batch_norm"] > 8 * x.nbytes / (4800e9 * 0.9) * 4
    assert predict(bf16, h100, "bf16", samples_per_rank=8, flops_per_step=0).breakdown["batch_norm"] == \
        pytest.approx(s.breakdown["batch_norm"])
    stream = predict(cl, h200, "bf16", samples_per_rank=8, flops_per_step=0).breakdown["batch_norm"]
    assert stream == pytest.approx(8 * x.nbytes / (4800e9 * speed_spec(h200).memory_efficiency))


def test_the_batchs_pageable_copy_is_on_the_gpus_and_the_hosts_timeline():
    from gpuwise.plan.speed.transfer import PAGEABLE_H2D_BYTES_PER_S

    c = OpCosts()
    c.input_bytes["forward"] = 38_535_680       # resnet50 b64: images + labels
    c.host_ops["forward"] = 10_000               # host-bound without the copy
    c.memory_bytes["forward"] = 1e6
    copy_s = 38_535_680 / PAGEABLE_H2D_BYTES_PER_S
    s = predict(c, lookup("h100"), "bf16", samples_per_rank=64, flops_per_step=0)
    assert s.breakdown["input_copy"] == pytest.approx(copy_s)
    # the copy syncs the stream and blocks the host: host time + copy, not max(host, copy)
    assert s.step_time_s == pytest.approx(launch.host_s(10_000) + launch.HOST_STEP_S + copy_s)
    # grad accumulation copies each micro-batch; recomputation does not copy again
    assert c.scaled(4).input_bytes["forward"] == 4 * 38_535_680
    sac = predict(c, lookup("h100"), "bf16", samples_per_rank=64, flops_per_step=0, selective="1")
    assert sac.breakdown["input_copy"] == pytest.approx(copy_s)


def test_the_trace_counts_the_batch_the_step_copies_to_the_gpu():
    from gpuwise.plan.tracing.trace import trace_step
    from gpuwise.step import StepConfig, tensors_in
    from gpuwise.workload import load_workload

    wl = load_workload("examples:mlp")
    trace = trace_step(wl, 4, StepConfig(optimizer="sgd"), target="cuda")
    assert trace.op_costs.input_bytes["forward"] == sum(t.nbytes for t in tensors_in(wl.build_batch(4))) > 0


def test_op_costs_sums_keep_their_keys_in_order_whatever_the_hash_seed():
    """`added` and `combine` (a rebuild's costs: the 3-block trace's plus the middle block's, extrapolated to L
    blocks) made their keys from a set of tuples of strings, which iterates in an order that changes with the
    interpreter's hash seed; the step time sums over them, so `fit --json` differed in the last bit from run to
    run. The keys come in order of first appearance: the first's, then the second's own."""
    from collections import Counter

    from gpuwise.plan.speed.ops import OpCosts

    a, b = OpCosts(), OpCosts()
    a.memory_bytes = Counter({("forward", f"aten.op{i}"): 1.0 + i for i in range(12)})
    b.memory_bytes = Counter({("backward", f"aten.op{i}"): 0.5 for i in range(12)})
    b.memory_bytes.update({("forward", "aten.op3"): 2.0})
    expected = [*a.memory_bytes, *(k for k in b.memory_bytes if k not in a.memory_bytes)]
    assert list(a.added(b).memory_bytes) == expected
    assert list(a.combine(b, 3).memory_bytes) == expected
