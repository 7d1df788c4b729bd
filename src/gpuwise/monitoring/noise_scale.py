"""The gradient noise scale B_simple (McCandlish et al. 2018) from per-example gradient norms or pairs of
consecutive steps' gradients (gpuwise/bootstrap/noise.py explains both estimators and their biases), with a confidence interval,
its evolution over training, and the `batch_vs_noise_scale` finding.

Each probed step (or pair of steps) i gives a_i, an unbiased estimate of tr(Sigma), and b_i, one of |G|^2
(the paper's Appendix A estimators). B_simple = mean(a) / mean(b): a ratio of means (the paper takes the
ratio of the two EMAs, not the mean of ratios, which the noisy denominator biases). The interval is
Fieller's 95% interval for a ratio of means (probed steps use different batches); its upper end is open
(null) when mean(b) is not clearly above zero (gradient noise swamps the signal: B_simple is large).
The evolution is the paper's EMA of a and of b, their ratio every few pairs.
"""

from __future__ import annotations

import math
from typing import Any

from ..tuning.goodput import lr_rule, steps_factor
from .result import Summary
from .rules import Finding, rule

Z95 = 1.959964          # two-sided 95% normal quantile
MIN_STEPS = 8           # fewer estimates: no answer
EMA_DECAY = 0.95        # per pair (an effective window of ~20 pairs)
EVOLUTION_POINTS = 20
FAR = 4.0               # a batch >= 4x away from B_simple: steps(B) = S_min(1 + B_noise/B) costs >= 2.5x the
                        # steps at B_simple/4 (5 vs 2 S_min), or 2.5x the samples at 4 B_simple (5 vs 2 E_min)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def fieller(a: list[float], b: list[float], z: float = Z95) -> tuple[float | None, float | None]:
    """Fieller's interval for mean(a)/mean(b) over paired samples: the R with
    (mean_a - R mean_b)^2 <= z^2 Var(mean_a - R mean_b). (None, None) when it is unbounded on both sides,
    (low, None) when only above."""
    n = len(a)
    ma, mb = _mean(a), _mean(b)
    va = sum((x - ma) ** 2 for x in a) / (n - 1) / n
    vb = sum((y - mb) ** 2 for y in b) / (n - 1) / n
    cab = sum((x - ma) * (y - mb) for x, y in zip(a, b)) / (n - 1) / n
    z2 = z * z
    qa = mb * mb - z2 * vb
    qb = -2 * (ma * mb - z2 * cab)
    qc = ma * ma - z2 * va
    disc = qb * qb - 4 * qa * qc
    if qa <= 0:  # mean(b) not distinguishable from 0: unbounded above
        if disc < 0:
            return None, None
        roots = sorted(((-qb - math.sqrt(disc)) / (2 * qa), (-qb + math.sqrt(disc)) / (2 * qa))) if qa else []
        low = max([r for r in roots if r > 0], default=None) if roots else None
        return low, None
    if disc < 0:
        return None, None
    r = math.sqrt(disc)
    return (-qb - r) / (2 * qa), (-qb + r) / (2 * qa)


def noise_scale(rows: list[dict[str, Any]], batch_size: int | None = None) -> dict[str, Any] | None:
    """The `gradient_noise_scale` summary key from `Timeline.noise` rows; None when there are too few.

    A row's batch of 0 (no DataLoader seen) falls back to `batch_size`; with no batch at all the estimate is
    given in batches (`b_simple_over_batch`) and `b_simple` is null. Rows of the per-example estimator are
    used when there are enough of them (it is not biased by the step between two gradients)."""
    usable = [r for r in rows if r.get("estimator") == "per-example"]
    if len(usable) < MIN_STEPS:
        usable = [r for r in rows if r.get("estimator") != "per-example"]
    est_name = (usable[0].get("estimator") or "consecutive-steps") if usable else None
    per_row = 1 if est_name == "per-example" else 2  # optimizer steps each row took
    points = [(int(r.get("step", 0)), int(r.get("batch") or 0) or int(batch_size or 0), float(r["g2"]),
               float(r["tr_b"])) for r in usable]
    if len(points) < MIN_STEPS:
        return None
    known = all(p[1] > 0 for p in points)
    a = [(p[1] if known else 1) * p[3] for p in points]   # tr(Sigma) (per batch when the batch is unknown)
    b = [p[2] for p in points]                           # |G|^2
    ma, mb = _mean(a), _mean(b)
    est = ma / mb if mb > 0 else None
    low, high = fieller(a, b)
    batches = sorted(p[1] for p in points)
    batch = batches[len(batches) // 2] if known else None
    out = {"b_simple": est if known else None, "ci_low": low if known else None, "ci_high": high if known else None,
           "steps_used": per_row * len(points), "batch_size": batch,
           "b_simple_over_batch": (est / batch if known else est) if est is not None else None,
           "ci_level": 0.95, "estimator": est_name,
           "evolution": _evolution(points, a, b, known), "grad_norm_sq": mb, "trace_cov": ma}
    if not known:
        out["ci_low_over_batch"], out["ci_high_over_batch"] = low, high
    return out


def _evolution(points: list[tuple], a: list[float], b: list[float], known: bool) -> list[dict[str, Any]]:
    """The paper's EMAs of tr(Sigma) and |G|^2, their ratio at up to EVOLUTION_POINTS steps."""
    every = max(1, math.ceil(len(points) / EVOLUTION_POINTS))
    ea = eb = 0.0
    w = 0.0
    out = []
    for i, (p, x, y) in enumerate(zip(points, a, b)):
        ea, eb, w = EMA_DECAY * ea + x, EMA_DECAY * eb + y, EMA_DECAY * w + 1
        if (i + 1) % every == 0 or i == len(points) - 1:
            value = ea / eb if eb > 0 else None
            out.append({"step": p[0], ("b_simple" if known else "b_simple_over_batch"): value})
    return out


@rule("batch_vs_noise_scale")
def batch_vs_noise_scale(s: Summary) -> Finding | None:
    g = s.gradient_noise_scale
    if not g or not g.get("b_simple") or not g.get("batch_size"):
        return None
    est, low, high, batch = g["b_simple"], g.get("ci_low"), g.get("ci_high"), g["batch_size"]
    rule_name, _ = lr_rule(s.extras.get("optimizer"))
    scaling = "linearly" if rule_name == "linear" else "by its square root"
    evidence = (f"gradient noise scale B_simple = {est:,.0f} (95% CI {_fmt(low)} to {_fmt(high)}, "
                f"{g['steps_used']} steps) vs a batch of {batch}")
    if low is not None and low >= FAR * batch:
        target = _round_batch(est)
        fewer = steps_factor(batch, est) / steps_factor(target, est)
        return Finding("batch_vs_noise_scale", evidence + ": each step's gradient is mostly noise",
                       f"raise the batch toward ~{target} (the noise scale): steps to the same loss fall ~{fewer:.1f}x "
                       f"(steps = S_min (1 + B_noise/B)); scale the learning rate {scaling} with it and warm it up; "
                       "`gpuwise tune --objective goodput` weighs that against the step time", severity="info")
    if high is not None and high * FAR <= batch:
        target = _round_batch(est)
        more = (batch + est) / (target + est)
        return Finding("batch_vs_noise_scale", evidence + ": the gradient is nearly noise-free, larger batches "
                       "hardly cut the steps", f"lower the batch toward ~{target}: the same loss then needs ~{more:.1f}x "
                       "fewer samples (samples = E_min (1 + B/B_noise)); lower the learning rate with it "
                       f"({scaling}), or spend the compute on a larger model", severity="info")
    return None


def _fmt(x: float | None) -> str:
    return "unbounded" if x is None else f"{x:,.0f}"


def _round_batch(x: float) -> int:
    """A power of two near x (batch sizes users pick)."""
    return 1 << max(0, round(math.log2(max(x, 1.0))))
