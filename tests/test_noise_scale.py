"""The gradient noise scale B_simple (monitoring/noise_scale.py, bootstrap/noise.py) and goodput (tuning/goodput.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpuwise.bootstrap.noise import NoiseProbe
from gpuwise.contracts import validate
from gpuwise.monitoring.noise_scale import fieller, noise_scale
from gpuwise.monitoring.result import Summary
from gpuwise.monitoring.rules import diagnose
from gpuwise.tuning import goodput

SCRIPT = Path(__file__).parent / "scripts" / "linreg_noise.py"


def _rows(points, estimator="per-example"):
    return [{"step": i, "batch": b, "g2": g2, "tr_b": tr_b, "estimator": estimator}
            for i, (b, g2, tr_b) in enumerate(points)]


def test_estimate_is_the_ratio_of_means_of_the_two_unbiased_estimators():
    # B = 10: tr(Sigma)_i = 10 * tr_b = 10, 20 (mean 15); |G|^2_i = 1, 2 (mean 1.5) -> B_simple = 15 / 1.5 = 10
    rows = _rows([(10, 1.0, 1.0), (10, 2.0, 2.0)] * 4)
    g = noise_scale(rows)
    assert g["b_simple"] == pytest.approx(10.0)
    assert g["steps_used"] == 8 and g["batch_size"] == 10 and g["estimator"] == "per-example"
    assert noise_scale(_rows([(10, 1.0, 1.0), (10, 2.0, 2.0)] * 4, "consecutive-steps"))["steps_used"] == 16
    assert g["b_simple_over_batch"] == pytest.approx(1.0)
    assert g["ci_low"] <= 10.0 <= g["ci_high"]


def test_too_few_pairs_give_no_estimate_and_unknown_batch_gives_it_in_batches():
    assert noise_scale(_rows([(10, 1.0, 1.0)] * 7)) is None
    g = noise_scale(_rows([(0, 1.0, 1.0), (0, 2.0, 2.0)] * 4))
    # no batch: tr(Sigma)/B mean 1.5 over |G|^2 1.5 = 1 batch
    assert g["b_simple"] is None and g["b_simple_over_batch"] == pytest.approx(1.0)
    assert noise_scale(_rows([(0, 1.0, 1.0), (0, 2.0, 2.0)] * 4), batch_size=32)["b_simple"] == pytest.approx(32.0)


def test_fieller_interval_opens_upwards_when_the_signal_is_not_above_noise():
    low, high = fieller([1.0, 1.2, 0.8, 1.1], [1.0, -1.0, 0.9, -0.8])
    assert high is None
    low, high = fieller([2.0, 2.5, 1.7, 2.1], [1.0, 1.1, 0.9, 1.0])
    assert low < 2.0 < high


def test_per_example_norms_match_torch_func_per_sample_gradients():
    """The probe's |G|^2 and tr(Sigma) from one step equal Appendix A's with B_small = 1 computed from
    per-sample gradients (torch.func.vmap(grad)) of a model with 2-D and 3-D Linear inputs and biases."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    x, y = torch.randn(6, 5, 3), torch.randn(6, 5, 2)  # (B, T, in): a per-example gradient sums over T
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    probe = NoiseProbe(torch, budget_fraction=1.0)
    try:
        loss = torch.nn.functional.mse_loss(model(x), y)  # mean: c_i = g_i / B, the scale cancels in the ratio
        loss.backward()
        probe.on_step(opt, 6)
    finally:
        probe.examples.disarm()
    (step, batch, g2, tr_b, estimator), = probe.rows()
    params = dict(model.named_parameters())

    def one(p, xi, yi):
        return torch.nn.functional.mse_loss(torch.func.functional_call(model, p, (xi[None],)), yi[None])

    per = torch.func.vmap(torch.func.grad(one), in_dims=(None, 0, 0))(params, x, y)
    flat = torch.cat([v.reshape(6, -1) for v in per.values()], 1)
    n = 6
    g1 = flat.square().sum(1).mean()
    gn = flat.mean(0).square().sum()
    # Appendix A, B_small = 1, B_big = n; the probe's norms are those of g_i / B (mean loss): x 1/B^2
    assert g2 * n * n == pytest.approx(float((n * gn - g1).detach() / (n - 1)), rel=1e-4)
    assert tr_b * n * n * n == pytest.approx(float((g1 - gn).detach() * n / (n - 1)), rel=1e-4)
    assert (step, batch, estimator) == (0, 6, "per-example") and probe.opt_name == "SGD"


def test_consecutive_steps_estimator_when_no_linear_layer_trains():
    model = torch.nn.Conv1d(1, 1, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    probe = NoiseProbe(torch, budget_fraction=1.0)
    for g in ([[[1.0]]], [[[2.0]]], [[[1.0]]], [[[3.0]]]):
        model(torch.ones(1, 1, 1)).sum().backward()  # the first forward: no Linear -> pairs from then on
        model.weight.grad = torch.tensor(g)
        probe.on_step(opt, 4)
    # the first step finds no Linear; pairs (1, 2): g = 2, 1 -> dot 2, |diff|^2 / 2 = 0.5; (3, ...) unfinished
    rows = probe.rows()
    assert rows == [(1, 4, 2.0, 0.5, "consecutive-steps")]


@pytest.mark.parametrize(("sigma", "batch"), [(0.5, 16), (3.0, 64)])
def test_watch_json_on_an_unmodified_linear_regression_is_within_25_percent(sigma, batch):
    d = 8
    expected = d * (1 + sigma ** 2) + 1  # the script's docstring derives it: 11 and 81
    out = subprocess.run([sys.executable, "-m", "gpuwise", "watch", "--json", "--", sys.executable, str(SCRIPT),
                          str(d), str(sigma), str(batch), "10000"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout)
    validate("watch", summary)  # docs/contracts.md: gradient_noise_scale's keys and types
    g = summary["gradient_noise_scale"]
    assert set(g) >= {"b_simple", "ci_low", "ci_high", "steps_used"}
    assert abs(g["b_simple"] / expected - 1) < 0.25, g
    assert g["ci_low"] < g["b_simple"] < g["ci_high"]
    assert g["steps_used"] >= 128 and g["batch_size"] == batch


def _summary(b_simple, low, high, batch, optimizer="SGD"):
    return Summary(steps=100, gradient_noise_scale={"b_simple": b_simple, "ci_low": low, "ci_high": high,
                                                    "steps_used": 200, "batch_size": batch},
                   extras={"optimizer": optimizer})


def test_finding_when_the_batch_is_far_below_or_above_the_noise_scale():
    kinds = lambda s: [f for f in diagnose(s) if f.kind == "batch_vs_noise_scale"]  # noqa: E731
    below = kinds(_summary(1000.0, 800.0, 1300.0, 32))
    assert len(below) == 1 and "raise the batch toward ~1024" in below[0].fix and "linearly" in below[0].fix
    above = kinds(_summary(100.0, 80.0, 130.0, 4096, optimizer="AdamW"))
    assert len(above) == 1 and "lower the batch toward ~128" in above[0].fix and "square root" in above[0].fix
    assert kinds(_summary(100.0, 80.0, 130.0, 128)) == []
    assert kinds(_summary(1000.0, 100.0, None, 32)) == []  # the interval reaches the batch: no claim


def test_goodput_picks_the_minimum_of_steps_times_step_time():
    # step_time = 1 + 0.01 B; B_noise = 100 -> B* = sqrt(100 * 1 / 0.01) = 100
    assert goodput.best_batch_linear_time(100.0, 1.0, 0.01) == pytest.approx(100.0)
    adv = goodput.advise(100.0, lambda b: 1 + 0.01 * b, [25, 50, 100, 200, 400], current_batch=25, n_gpus=4,
                         optimizer="SGD")
    assert adv.batch_size == 100 and adv.per_gpu_batch_size == 25
    # time at 25: (1 + 4)(1.25) = 6.25; at 100: (1 + 1)(2) = 4 -> x1.5625
    assert adv.speedup == pytest.approx(6.25 / 4)
    # SGD: lr x (1 + 100/25) / (1 + 100/100) = 2.5 -> warm-up (> 2x)
    assert adv.lr_rule == "linear" and adv.lr_factor == pytest.approx(2.5) and adv.warmup
    adam = goodput.advise(100.0, lambda b: 1 + 0.01 * b, [25, 100], current_batch=25, optimizer="AdamW")
    assert adam.lr_rule == "sqrt" and adam.lr_factor == pytest.approx(math.sqrt(2.5)) and adam.warmup is None


def test_path_model_reduces_to_eq_2_11_and_is_capped_by_stability():
    # a constant noise scale along the path: the weighted mean is it, and steps(B) follows S_min (1 + B_noise / B)
    assert goodput.path_b_noise([50.0] * 10, 100) == pytest.approx(50.0)
    # a growing one: steps at B = 100 are weighted 1 / (1 + B_t / 100): 1/2 at B_t = 100, 1/4 at 300
    assert goodput.path_b_noise([100.0, 300.0], 100) == pytest.approx((100 / 2 + 300 / 4) / (1 / 2 + 1 / 4))
    g2, ghg, trh = 4.0, 2.0, 200.0  # e_max = 2, B_noise = 100
    path = [(g2, ghg, trh, 0.0)] * 5
    ratio = goodput.steps_along_path(path, 10, 50, 0.1) / goodput.steps_along_path(path, 1000, 50, 0.1)
    assert ratio == pytest.approx(goodput.steps_factor(10, 100.0) / goodput.steps_factor(1000, 100.0))
    # a top eigenvalue of 10 caps the rate at 0.2 < e_opt: a large batch no longer reaches S_min, the ratio shrinks
    capped = [(g2, ghg, trh, 10.0)] * 5
    r_cap = goodput.steps_along_path(capped, 10, 50, 0.1) / goodput.steps_along_path(capped, 1000, 50, 0.1)
    assert 1 < r_cap < ratio
    # the same cap from the runs' largest rate
    assert goodput.steps_along_path(path, 1000, 50, 0.1, lr_cap=0.2) == pytest.approx(
        goodput.steps_along_path(capped, 1000, 50, 0.1))


def test_centred_means_smooth_without_lag():
    # a straight line is its own centred mean (away from the ends): no lag, unlike an EMA
    rows = [(float(i), 2.0 * i) for i in range(21)]
    out = goodput.centred_means(rows, 0.1)  # +-2 rows
    assert out[10] == pytest.approx([10.0, 20.0]) and out[3] == pytest.approx([3.0, 6.0])
    assert out[0] == pytest.approx([1.0, 2.0])  # the ends average what there is: rows 0-2
    assert goodput.centred_means([(1.0,), (3.0,)], 0.0) == [[2.0], [2.0]]  # at least one row either side


def test_noise_floor_is_the_settled_excess_of_a_quadratic():
    assert goodput.noise_floor(0.01, 10, 8.0) == pytest.approx(0.01 * 8.0 / 40)  # lr tr(Sigma) / (4B), lr c -> 0
    assert goodput.noise_floor(1.0, 10, 8.0, curvature=1.0) == pytest.approx(8.0 / 20)  # / (2B (2 - lr c))
    assert goodput.noise_floor(1.0, 10, 8.0, curvature=2.0) == math.inf


def test_steps_to_target_follows_the_path_below_the_target_by_the_noise_floor():
    # a path whose every reference step (lr 0.1, curvature along G 0.5) covers 0.1 - 0.1^2 / 2 * 0.5 = 0.0975; at
    # rate 1 (lr_cap; 2 / lambda_max = 4) a step covers reference_steps_per_step(1, 0.1, 0.5) of them
    path = [(1.0, 0.5, 0.0, 0.5)] * 20
    losses = [1.0 - 0.0975 * i for i in range(21)]
    target = 1.0 - 0.0975 * 10 + 1e-3  # reached after 10 reference steps
    per = goodput.reference_steps_per_step(1.0, 0.1, 0.5)
    steps, lr, limited = goodput.steps_to_target(path, losses, target, 1000, 10 ** 9, 0.1, 0.0, lr_cap=1.0)
    assert lr == 1.0 and not limited and steps == pytest.approx(10 / per)
    # with noise (tr(Sigma) = 1) at B = 1 the run must reach target - lr / 4: 3 more reference steps at rate 1
    noisy, lr1, _ = goodput.steps_to_target(path, losses, target, 1, 10 ** 9, 0.1, 1.0, lr_cap=1.0)
    assert lr1 == 1.0 and noisy == pytest.approx(13 / per)
    big, _, _ = goodput.steps_to_target(path, losses, target, 10 ** 6, 10 ** 9, 0.1, 1.0, lr_cap=1.0)
    assert big == pytest.approx(steps)
    # a target below the reference run's end, noise floor included: no rate reaches it
    none, _, _ = goodput.steps_to_target(path, losses, -5.0, 1, 10 ** 9, 0.1, 1.0, lr_cap=1.0)
    assert none == math.inf
    # a path that ends 2 reference steps past the target: rate 1 needs 3, so a lower rate is the best the path
    # can tell, and the answer says the path limited it
    cut, lr_cut, limited = goodput.steps_to_target(path[:12], losses[:13], target, 1, 10 ** 9, 0.1, 1.0, lr_cap=1.0)
    assert lr_cut < 1.0 and limited and cut > noisy


def test_a_large_step_compounds_along_the_path_as_gradient_descent_does_on_a_quadratic():
    # L = c/2 x^2, c = 0.5: gradient descent at e multiplies the loss by (1 - e c)^2 a step. The reference (lr 0.1)
    # takes 0.95^2 a step; at e = 1 a step takes 0.25, so the loss of 40 reference steps falls in
    # ln(0.95^80) / ln(0.25) = 2.96 steps. The ratio of one-step gains (eq. 2.4: 0.75 / 0.0975 = 7.7 reference
    # steps a step) gave 5.2: what put logistic regression's largest batch at 8.7 steps for 5 measured.
    c = 0.5
    path = [(c * c * 0.95 ** (2 * i), c ** 3 * 0.95 ** (2 * i), 0.0, c) for i in range(60)]  # |G|^2, G'HG at x_i
    losses = [0.95 ** (2 * i) for i in range(61)]
    target = 0.95 ** 80 + 1e-12
    steps, lr, _ = goodput.steps_to_target(path, losses, target, 10 ** 6, 10 ** 9, 0.1, 0.0, lr_cap=1.0)
    exact = math.log(0.95 ** 80) / math.log(0.25)
    assert lr == 1.0 and steps == pytest.approx(exact, rel=1e-6)
    assert 40 / goodput.reference_steps_per_step(1.0, 0.1, c) == pytest.approx(exact)
    one_step_ratio = (1 - 0.5 ** 2) / (1 - 0.95 ** 2)
    assert 40 / one_step_ratio > 1.7 * exact
    # a step smaller than the reference's keeps eq. 2.4's ratio; no progress at e c >= 2
    assert goodput.reference_steps_per_step(0.05, 0.1, c) == pytest.approx((1 - 0.975 ** 2) / (1 - 0.95 ** 2))
    assert goodput.reference_steps_per_step(4.0, 0.1, c) == 0.0


def test_fit_step_time_is_least_squares_and_non_negative():
    a, b = goodput.fit_step_time([(10, 2.0), (20, 3.0), (40, 5.0)])  # exactly 1 + 0.1 B
    assert a == pytest.approx(1.0) and b == pytest.approx(0.1)


def test_gpuwise_monitor_measures_it_in_process(monkeypatch):
    import gpuwise

    monkeypatch.setenv("GPUWISE_NOISE_BUDGET", "1")  # probe every step: this test is about the estimate, not the cost
    torch.manual_seed(0)
    d, sigma, batch = 8, 1.0, 32
    w_star = torch.randn(d)
    x = torch.randn(batch * 1500, d)
    y = x @ w_star + sigma * torch.randn(len(x))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch)
    model = torch.nn.Linear(d, 1, bias=False)
    with torch.no_grad():
        delta = torch.randn(d)
        model.weight.copy_(w_star + delta / delta.norm())
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with gpuwise.monitor(device="cpu", sample=False) as mon:
        for xb, yb in mon.loader(loader):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(xb).squeeze(1), yb).backward()
            opt.step()
    g = mon.summary()["gradient_noise_scale"]
    assert g["batch_size"] == batch and g["steps_used"] >= 128 and g["estimator"] == "per-example"
    assert abs(g["b_simple"] / (d * (1 + sigma ** 2) + 1) - 1) < 0.25, g  # 17
    assert mon.summary()["optimizer"] == "SGD"


def test_a_trials_band_is_the_t_interval_of_its_block_rates():
    from gpuwise.tuning.noise_band import Band, band, beats

    # 10 steps of 1 s, 10 samples each except two: blocks of 2 steps -> rates 10, 10, 15, 10, 10
    samples = [10, 10, 10, 10, 20, 10, 10, 10, 10, 10]
    b = band(samples, [1.0] * 10)
    assert b.blocks == 5 and b.mean == pytest.approx(11.0)
    # sd of (10, 10, 15, 10, 10) = sqrt(20 / 4) = 2.236; t(4) = 2.776: half = 2.776 * 2.236 / sqrt(5) = 2.776
    assert b.high - b.mean == pytest.approx(2.776, rel=1e-3) and b.mean - b.low == pytest.approx(2.776, rel=1e-3)
    assert beats(Band(20.0, 15.0, 25.0, 5), b) and not beats(Band(14.0, 13.0, 15.0, 5), b)
    assert not beats(Band(11.2, 11.15, 11.25, 5), Band(11.0, 10.95, 11.05, 5))  # outside the band but < 5%


def test_goodput_from_tune_trials_and_from_one_batch():
    from gpuwise.tuning.records import Trial

    # samples/s at B = 32, 64, 128, 256: step times 0.1, 0.12, 0.16, 0.32 s; B_noise = 64
    # time / S_min: (1 + 2) 0.1 = 0.3; (1 + 1) 0.12 = 0.24; (1 + 0.5) 0.16 = 0.24 (tie: the smaller wins); 1.25 x 0.32 = 0.4
    trials = [Trial(workload="w", device="cpu", kind="compute", batch_size=b, status="ok", samples_per_s=b / t) for b, t in
              ((32, 0.1), (64, 0.12), (128, 0.16), (256, 0.32))]
    adv = goodput.from_trials(trials, 64.0, 32, n_gpus=2, optimizer="AdamW")
    assert adv.batch_size == 64 and adv.per_gpu_batch_size == 32 and adv.speedup == pytest.approx(0.3 / 0.24)
    one = goodput.from_one_batch(300.0, 32, n_gpus=4, optimizer="SGD")
    assert one.batch_size == 256 and one.per_gpu_batch_size == 64 and one.lr_rule == "linear"
    # lr x (1 + 300/32) / (1 + 300/256) = 10.375 / 2.172 = 4.78 -> warm-up
    assert one.lr_factor == pytest.approx(10.375 / (1 + 300 / 256)) and one.warmup
