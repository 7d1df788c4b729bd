"""Time and cost to train (plan/speed/cost.py): the arithmetic, CPU only."""

import pytest

from gpuwise.errors import GpuwiseError
from gpuwise.plan.speed.cost import HOURS_PER_YEAR, parse_prices, training_cost


def test_rent_and_own_arithmetic():
    # 1e6 samples at 100 samples/s on 8 GPUs: 10,000 s = 2.778 h x 8 = 22.22 GPU-hours
    c = training_cost("h100-sxm", 8, 100.0, 1e6, rent={"h100-sxm": 2.0}, buy={"h100-sxm": 35064.0})
    assert c.seconds == pytest.approx(1e4)
    assert c.gpu_hours == pytest.approx(1e4 / 3600 * 8)
    assert c.rent_usd == pytest.approx(c.gpu_hours * 2.0)
    # own: 35,064 $ over 4 years (35,064 h) = 1 $/h + 0.7 kW x 0.13 $/kWh = 0.091 $/h
    assert 4 * HOURS_PER_YEAR == pytest.approx(35064.0)
    assert c.own_usd == pytest.approx(c.gpu_hours * (1.0 + 0.7 * 0.13))


def test_unpriced_gpu_gets_time_only():
    c = training_cost("rtx-a6000", 1, 10.0, 100.0)
    assert c.seconds == pytest.approx(10.0) and c.rent_usd is None and c.own_usd is None


def test_parse_prices_uses_catalog_names():
    assert parse_prices(["H100=2.49", "l4=0.8"]) == {"h100-sxm": 2.49, "l4": 0.8}
    with pytest.raises(GpuwiseError):
        parse_prices(["H100"])
    with pytest.raises(GpuwiseError):
        parse_prices(["H100=cheap"])


def test_fit_results_get_time_and_cost_of_their_fastest_fitting_option():
    from gpuwise.plan.fit import FitOption, FitResult
    from gpuwise.plan.fit_gpus import attach_costs

    fast = FitOption("ddp", {"nproc": 2}, True, 1, 10.0, 8, [])
    r = FitResult("w", "NVIDIA H100 SXM5 80GB", 2, 80 * 2**30, 8, [fast], tokens_per_sample=1000)
    attach_costs([r], tokens=1e7, rent={"h100-sxm": 2.0})
    # 1e7 tokens / 1000 per sample = 1e4 samples at 10 samples/s = 1000 s on 2 GPUs = 0.556 GPU-h x 2 $/h
    assert r.cost.seconds == pytest.approx(1000.0)
    assert r.cost.rent_usd == pytest.approx(1000 / 3600 * 2 * 2.0)
    assert r.to_dict()["cost"]["gpu_hours"] == pytest.approx(1000 / 3600 * 2)
    with pytest.raises(GpuwiseError):
        attach_costs([r], tokens=1e7, samples=5.0)
