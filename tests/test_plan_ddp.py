"""The per-rank DDP / ZeRO memory plan: pure arithmetic, checked against torch and the ZeRO paper."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from gpuwise.plan.memory.ddp import MIB, bucket_sizes, optimizer_state_bytes, plan_ddp


def test_buckets_match_torch_assignment_in_gradient_order():
    sizes = [300_000 * 4] * 30 + [10 * MIB, 40 * MIB, 4]  # 1.2 MB tensors, then a big and a huge one
    params = [torch.empty(s // 4) for s in sizes]
    # DDP rebuilds its buckets in gradient-ready order (about reverse registration), caps [1 MiB, 25 MiB]
    idx, _ = dist._compute_bucket_assignment_by_size(list(reversed(params)), [MIB, 25 * MIB], [False] * len(params))
    rev = list(reversed(sizes))
    expected = sorted(sum(rev[i] for i in b) for b in idx)
    assert sorted(bucket_sizes(sizes)) == expected
    assert sum(bucket_sizes(sizes)) == sum(sizes)


def test_first_bucket_is_one_mib_then_25_mib():
    assert bucket_sizes([MIB // 2] * 4) == [MIB, MIB]            # 0.5+0.5 reaches the 1 MiB first cap, then 1 MiB left
    assert bucket_sizes([MIB // 2] * 4, bucket_cap_mb=1) == [MIB, MIB]
    # 10 closes the 1 MiB first bucket; 10+10 < 25 <= 10+10+10; 20 left over
    assert bucket_sizes([10 * MIB] * 6, bucket_cap_mb=25) == [10 * MIB, 30 * MIB, 20 * MIB]


def test_zero_paper_figure_1():
    # Rajbhandari et al. 2020, Figure 1: 7.5B parameters, mixed-precision Adam: 2 + 2 + 12 bytes per
    # parameter, 64 ranks: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB per rank
    psi, n = 7.5e9, 64
    plan = plan_ddp(int(2 * psi), int(12 * psi), n, gradient_as_bucket_view=True)
    gb = {r.strategy: r.total_bytes / 1e9 for r in plan.rows}
    assert gb["ddp"] == pytest.approx(120, abs=0.1)
    assert gb["zero1"] == pytest.approx(31.4, abs=0.1)
    assert gb["zero2"] == pytest.approx(16.6, abs=0.1)
    assert gb["zero3/fsdp"] == pytest.approx(1.9, abs=0.1)


def test_buckets_copy_gradients_unless_bucket_view():
    # 1000 B params, adamw state 2000 B, 4 ranks
    plan = plan_ddp(1000, optimizer_state_bytes(1000, "adamw"), 4)
    assert plan.row("ddp").total_bytes == 1000 + 1000 + 1000 + 2000   # + a bucket copy of the gradients
    assert plan.row("ddp+bucket_view").total_bytes == 4000
    assert plan.row("zero1").total_bytes == 1000 + 1000 + 500
    assert plan.row("zero2").total_bytes == 1000 + 250 + 500
    assert plan.row("zero3/fsdp").total_bytes == 250 + 250 + 500
    assert plan.to_dict()["bucket_count"] == 1


def test_bad_input():
    with pytest.raises(ValueError):
        plan_ddp(10, 10, 0)
    with pytest.raises(ValueError):
        optimizer_state_bytes(10, "lion")
