"""`gpuwise scale`: the efficiency arithmetic (pure) and the JSON contract on 1 and 2 CPU ranks."""

from __future__ import annotations

import json

import pytest

from gpuwise import cli
from gpuwise.contracts import validate
from gpuwise.scaleout.scale import RankTiming, points_from


def test_points_arithmetic():
    # per-rank batch 10; 1 rank: 0.1 s/step; 2 ranks: 0.125 s/step of which 0.075 s compute
    timings = [RankTiming(1, "gloo", "cpu", step_s=0.100, compute_s=0.090, gradient_bytes=1000),
               RankTiming(2, "gloo", "cpu", step_s=0.125, compute_s=0.075, gradient_bytes=1000)]
    one, two = points_from(timings, per_rank_batch=10)
    assert one.samples_per_s == pytest.approx(100) and one.efficiency == pytest.approx(1.0)
    assert two.samples_per_s == pytest.approx(160)            # 2 * 10 / 0.125
    assert two.per_rank_samples_per_s == pytest.approx(80)
    assert two.efficiency == pytest.approx(0.8)                # 160 / (2 * 100)
    assert two.communication_s == pytest.approx(0.05)
    assert two.communication_fraction == pytest.approx(0.4)
    assert two.bus_bandwidth_bytes_per_s == pytest.approx(2 * 1 / 2 * 1000 / 0.05)  # 2(n-1)/n * bytes / s
    assert two.fixed_global_speedup == pytest.approx(0.1 / (0.05 + 0.05))          # t1 / (t1/2 + comm) = 1.0
    with pytest.raises(ValueError):
        points_from(timings[1:], per_rank_batch=10)


def test_scale_json_contract_on_cpu_ranks(capfd, monkeypatch):
    monkeypatch.delenv("GPUWISE_FAKE_GPUS", raising=False)
    code = cli.main(["scale", "examples:mlp", "-n", "2", "--steps", "3", "--warmup", "1", "-b", "8",
                     "--device", "cpu", "--json"])
    out, err = capfd.readouterr()
    assert code == 0, err
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1
    result = json.loads(lines[0])
    validate("scale", result)
    assert result["per_rank_batch_size"] == 8
    assert [p["nproc"] for p in result["points"]] == [1, 2]  # 1 rank is always measured as the reference
    for p in result["points"]:
        for key in ("nproc", "samples_per_s", "per_rank_samples_per_s", "efficiency"):
            assert key in p
        assert p["samples_per_s"] == pytest.approx(p["nproc"] * p["per_rank_samples_per_s"])
        assert p["compute_s"] > 0 and p["step_s"] >= p["communication_s"] >= 0
    assert result["points"][0]["efficiency"] == pytest.approx(1.0)
    two = result["points"][1]
    assert two["efficiency"] == pytest.approx(two["samples_per_s"] / (2 * result["points"][0]["samples_per_s"]))
    assert two["gradient_bytes"] == (32 * 16 + 16) * 4  # mlp: Linear(32, 16) in fp32
    assert "Goyal" in result["lr_rule"] and result["backend"] == "gloo"
