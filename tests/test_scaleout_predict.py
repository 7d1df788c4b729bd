"""`gpuwise scale`: the predicted efficiency (1-rank compute + the communication model's all-reduce) next to the
measured one, with the link it assumed said."""

from __future__ import annotations

import json

import pytest

from gpuwise import cli
from gpuwise.plan.speed.comm import LINKS
from gpuwise.scaleout import predict
from gpuwise.scaleout.scale import RankTiming, ScaleResult, points_from


def test_prediction_arithmetic_on_the_assumed_gloo_link():
    link = predict.GLOO_LOOPBACK
    # 1 rank: 0.1 s step; 1e8 gradient bytes. 2 ranks, ring: 2 (2-1)/2 x 1e8 B / 2e9 B/s = 0.05 s
    # + 50 us latency + 1 hop x 1 us
    (one, two) = predict.predict([1, 2], 0.1, 100_000_000, link)
    assert one.efficiency == 1.0 and one.communication_s == 0.0
    assert two.communication_s == pytest.approx(0.05 + 50e-6 + 1e-6)
    assert two.efficiency == pytest.approx(0.1 / (0.1 + 0.050051))
    # 4 ranks: 2 x 3/4 x 1e8 / 2e9 = 0.075 s + 50 us + 3 hops
    (four,) = predict.predict([4], 0.1, 100_000_000, link)
    assert four.communication_s == pytest.approx(0.075 + 50e-6 + 3e-6)


def test_attach_fills_points_and_says_the_link():
    timings = [RankTiming(1, "gloo", "cpu", step_s=0.100, compute_s=0.090, gradient_bytes=1000),
               RankTiming(2, "gloo", "cpu", step_s=0.125, compute_s=0.075, gradient_bytes=1000)]
    result = ScaleResult("w", 10, "gloo", "cpu", points_from(timings, 10))
    predict.attach(result)
    assert result.link["name"] == "gloo-loopback" and result.link["assumed"] is True
    assert result.points[0].predicted_efficiency == 1.0 and 0 < result.points[1].predicted_efficiency < 1
    predict.attach(result, "nvlink4")
    assert result.link == {"name": "nvlink4", "busbw_bytes_per_s": LINKS["nvlink4"].busbw_bytes_per_s,
                           "latency_s": LINKS["nvlink4"].latency_s, "source": LINKS["nvlink4"].source,
                           "assumed": False}


def test_scale_prints_predicted_next_to_measured(capfd, monkeypatch):
    monkeypatch.delenv("GPUWISE_FAKE_GPUS", raising=False)
    code = cli.main(["scale", "examples:mlp", "-n", "2", "--steps", "3", "--warmup", "1", "-b", "8",
                     "--device", "cpu", "--json"])
    out, err = capfd.readouterr()
    assert code == 0, err
    result = json.loads(out)
    one, two = result["points"]
    assert one["predicted_efficiency"] == 1.0
    link = result["link"]
    assert link["name"] == "gloo-loopback" and link["source"].startswith("measured here") and not link["assumed"]
    used = predict.Link("gloo-loopback", link["busbw_bytes_per_s"], 1.0, link["latency_s"], link["source"])
    expected = predict.predict([2], one["step_s"], one["gradient_bytes"], used)[0]
    assert two["predicted_communication_s"] == pytest.approx(expected.communication_s)
    # either a number (the host was otherwise idle) or "cannot tell" with the reason, never both
    assert (two["predicted_efficiency"] is None) == (two["prediction_caveat"] is not None)
    if two["prediction_caveat"]:
        assert two["prediction_caveat"].startswith("cannot tell: ")


def test_gloo_loopback_is_measured_here():
    link = predict.measure_gloo_loopback(nbytes=1 << 20, repeats=1)
    assert link is not None and link.source.startswith("measured here")
    assert link.busbw_bytes_per_s > 0 and link.latency_s > 0


def test_core_contention_and_other_load():
    link = predict.GLOO_LOOPBACK
    # 2 ranks x 1 thread on 1 core: each rank's compute takes twice as long
    idle = predict.Host(cores=1, threads_per_rank=1, other_load=0.0)
    (two,) = predict.predict([2], 0.1, 0, link, idle)
    assert two.caveat is None and two.step_s == pytest.approx(0.2 + two.communication_s)
    # enough cores: no stretch
    (two,) = predict.predict([2], 0.1, 0, link, predict.Host(cores=4, threads_per_rank=1, other_load=0.0))
    assert two.step_s == pytest.approx(0.1 + two.communication_s)
    # others running: cannot tell, and why
    (two,) = predict.predict([2], 0.1, 0, link, predict.Host(cores=2, threads_per_rank=1, other_load=3.0))
    assert two.caveat.startswith("cannot tell: 3.0 other runnable processes")
    (two,) = predict.predict([2], 0.1, 0, link, predict.Host(cores=2, threads_per_rank=1, other_load=None))
    assert two.caveat.startswith("cannot tell: ")
