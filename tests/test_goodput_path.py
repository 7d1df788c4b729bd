"""tune --objective goodput with a reference path: steps(B) and the learning rate from goodput.steps_to_target,
the model benchmarks/goodput_validate.py validates, instead of eq. 2.11."""

from __future__ import annotations

import json
import math

import pytest
from conftest import run_cli

from gpuwise.tuning import goodput


def quadratic_path(c: float = 0.5, ref_lr: float = 0.1, n: int = 200) -> goodput.ReferencePath:
    """Gradient descent at ref_lr on L = c/2 x^2 (loss x (1 - ref_lr c)^2 a step), with SGD noise tr(Sigma) = 1
    along curvature c."""
    q = (1 - ref_lr * c) ** 2
    readings = [(c * c * q ** i, c ** 3 * q ** i, c, c) for i in range(n)]
    return goodput.ReferencePath(readings, [q ** i for i in range(n + 1)], batch=10 ** 9, lr=ref_lr, tr_sigma=1.0,
                                 curvature=c, target=q ** 40, lr_max=1.0)


def test_advise_with_a_path_takes_steps_and_rate_from_steps_to_target():
    path = quadratic_path()
    step_time = {8: 1.0, 64: 2.0, 512: 8.0, 4096: 60.0}
    adv = goodput.advise(None, step_time.__getitem__, list(step_time), current_batch=8, path=path)
    assert adv.steps_model == "reference_path" and adv.lr_rule == "path"
    for p in adv.points:
        steps, lr, _ = path.steps(p.batch_size)
        assert p.steps == pytest.approx(steps) and p.lr == pytest.approx(lr)
        assert p.time_factor_s == pytest.approx(steps * step_time[p.batch_size])
    best = min(adv.points, key=lambda p: p.time_factor_s)
    assert adv.batch_size == best.batch_size and adv.lr == best.lr
    assert adv.lr_factor == pytest.approx(best.lr / adv.points[0].lr)
    assert adv.speedup == pytest.approx(adv.points[0].time_factor_s / best.time_factor_s)
    # the noise floor lr tr(Sigma) / (2B (2 - lr c)) is what keeps B = 8 slow: it must run at a lower rate, further
    assert adv.points[0].lr < adv.points[-1].lr and adv.points[0].steps > 3 * adv.points[-1].steps
    # the same step times under eq. 2.11 with a B_noise far above the batches: a different answer (the largest)
    eq = goodput.advise(10 ** 6, step_time.__getitem__, list(step_time), current_batch=8)
    assert eq.steps_model == "eq_2_11" and eq.batch_size == 4096 != adv.batch_size


def test_a_reference_path_round_trips_through_json_and_bad_ones_are_refused(tmp_path):
    path = quadratic_path(n=50)
    f = tmp_path / "p.json"
    f.write_text(json.dumps(path.to_dict()))
    back = goodput.load_path(str(f))
    assert back.steps(64) == path.steps(64)
    d = path.to_dict()
    del d["target"]
    f.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="needs target"):
        goodput.load_path(str(f))
    f.write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a reference path"):
        goodput.load_path(str(f))


def test_from_path_one_batch_is_the_paths_critical_batch():
    path = quadratic_path()
    adv = goodput.from_path_one_batch(path, 8, n_gpus=2)
    s_min = path.steps(2 ** 24)[0]
    assert adv.points[0].steps <= 2 * s_min < path.steps(adv.batch_size // 2)[0]
    assert adv.per_gpu_batch_size * 2 == adv.batch_size and adv.lr == path.steps(adv.batch_size)[1]


def test_tune_cli_with_a_reference_path(tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps(quadratic_path().to_dict()))
    proc = run_cli("tune", "examples:mlp", "--device", "cpu", "--batch-sizes", "8,512", "--measure", "0.2s",
                   "--budget", "60s", "--objective", "goodput", "--reference-path", str(f), "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    pytest.importorskip("jsonschema")
    from gpuwise.contracts import validate

    validate("tune", out)
    g = out["goodput"]
    assert g["steps_model"] == "reference_path" and g["lr_rule"] == "path"
    path = quadratic_path()
    for p in g["points"]:
        assert p["steps"] == pytest.approx(path.steps(p["batch_size"])[0])
        assert p["time_factor_s"] == pytest.approx(p["steps"] * p["step_time_s"])
    assert g["batch_size"] == min(g["points"], key=lambda p: p["time_factor_s"])["batch_size"]
    assert math.isfinite(g["lr"])


@pytest.mark.parametrize("text, extra, pattern", [
    ("{}", (), "needs readings"),
    ("not json", (), "cannot read the reference path"),
    (None, ("--target-loss", "0.1"), "--target-loss needs --reference-path"),
])
def test_bad_reference_path_is_one_line_and_exit_2(tmp_path, text, extra, pattern):
    import re

    args = ["tune", "examples:mlp", "--objective", "goodput", "--budget", "5s"]
    if text is not None:
        f = tmp_path / "p.json"
        f.write_text(text)
        args += ["--reference-path", str(f)]
    proc = run_cli(*args, *extra)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and re.search(pattern, lines[0]), proc.stderr


def test_record_reads_a_linear_regressions_known_path():
    # y = x.w* + sigma eps, x ~ N(0, I_4), loss 0.5 (x.w - y)^2: H = I, so G'HG / |G|^2 = lambda_max = 1 and
    # tr(H Sigma) / tr(Sigma) = 1; the expected loss is 0.5 (|w - w*|^2 + sigma^2) and, at |w - w*|^2 = 0.1,
    # tr(Sigma) = (d + 1) 0.1 + d sigma^2 = 4.5
    torch = pytest.importorskip("torch")
    from gpuwise.tuning import reference

    d, sigma = 4, 1.0
    w_star = torch.tensor([1.0, -1.0, 0.5, 1.5])

    def make_model():
        m = torch.nn.Linear(d, 1, bias=False)
        torch.nn.init.zeros_(m.weight)
        return m

    def batch(n, gen):
        x = torch.randn(n, d, generator=gen)
        return x, x @ w_star + sigma * torch.randn(n, generator=gen)

    def loss(m, bt):
        return 0.5 * ((m(bt[0]).squeeze(1) - bt[1]) ** 2).mean()

    def eval_loss(m):
        with torch.no_grad():
            return 0.5 * (float(((m.weight[0] - w_star) ** 2).sum()) + sigma ** 2)

    target = 0.5 * (0.1 + sigma ** 2)
    path = reference.record(make_model, loss, batch, eval_loss, batch_size=64, lr=0.05, target=target, lr_max=1.0)
    # the losses are smoothed over +-10 % of the run: the first ones are means over the run's early steps, below
    # the start's 0.5 (|w*|^2 + sigma^2) = 2.75 (the mean over steps 0..11 here)
    assert len(path.losses) == len(path.readings) + 1 and target < path.losses[0] < 2.75
    assert path.losses[-1] < target and all(a >= b for a, b in zip(path.losses, path.losses[1:]))
    c = sorted(ghg / g2 for g2, ghg, _, _ in path.readings)
    lam = sorted(r[3] for r in path.readings)
    assert c[len(c) // 2] == pytest.approx(1.0, rel=0.15) and lam[len(lam) // 2] == pytest.approx(1.0, rel=0.35)
    assert path.curvature == pytest.approx(1.0, rel=0.2) and path.tr_sigma == pytest.approx(4.5, rel=0.25)
    small, big = path.steps(8)[0], path.steps(4096)[0]
    assert math.isfinite(big) and small > 2 * big
