"""Record a reference run's path for `tune --objective goodput --reference-path` (goodput.ReferencePath).

A reference run (plain SGD at a middle batch and a slow rate) trains to the target loss, then the same run (same
seed, same batches) again, past the target, reading at every step the quantities of McCandlish et al. 2018's
one-step model (eq. 2.4-2.7): |G|^2, G'HG, tr(H Sigma) and tr(Sigma) by the two-batch-size estimators
(Appendix A), H's top eigenvalue by power iteration, and the loss. `goodput.steps_to_target` follows that path
for any batch. benchmarks/goodput_validate.py validates the model with these readings.

    from gpuwise.tuning import reference
    path = reference.record(make_model, loss, batch, eval_loss, batch_size=128, lr=0.03, target=0.7)
    json.dump(path.to_dict(), open("path.json", "w"))   # gpuwise tune ... --objective goodput --reference-path path.json

`make_model()` returns the model (the same weights every call), `batch(n, generator)` a batch of n examples
drawn with that torch.Generator, `loss(model, batch)` the scalar training loss, `eval_loss(model)` a float.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from ..monitoring.noise_scale import EMA_DECAY
from .goodput import ReferencePath, centred_means

POWER_ITERATIONS = 20   # H's top eigenvalue: power iterations at the first reading ...
POWER_WARM = 3          # ... then per reading, from the last vector (H moves little in a step)
PATH_WINDOW = 0.1       # the path's readings: centred means over +-10 % of the run
REF_PAST = 2.0          # the readings go on for twice the run's steps to the target again


class HessianNoise:
    """The paper's B_noise = tr(H Sigma) / G'HG (McCandlish et al. 2018, eq. 2.6; B_simple = tr(Sigma)/|G|^2 is
    its value when H is a multiple of the identity, section 2.2) at the current parameters, with the same
    two-batch-size estimators as B_simple (Appendix A) applied to the H-norm: for a mean gradient g_b over b
    examples, E[g_b' H g_b] = G'HG + tr(H Sigma)/b. Per reading: `parts` independent micro-batches of `small`
    examples (g_j) and their mean (a batch of parts x small), H from an independent batch of `h_batch`
    (Hessian-vector products, double backward), so H's sampling noise is independent of the g's. Batches
    come from a generator of their own: the training run's path is unchanged. Readings also give B_simple
    from the same gradients (H = I), for comparison."""

    def __init__(self, loss: Callable, batch: Callable, small: int, parts: int, h_batch: int, seed: int):
        import torch

        self.loss, self.batch, self.small, self.parts, self.h_batch = loss, batch, small, parts, h_batch
        self.gen = torch.Generator().manual_seed(seed)
        self.readings: list[tuple] = []  # (G'HG, tr(H Sigma), |G|^2, tr(Sigma), lambda_max)
        self.top = None                  # the power iteration's vector

    def read(self, m) -> None:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        params = [p for p in m.parameters() if p.requires_grad]
        with sdpa_kernel(SDPBackend.MATH):  # CPU's fused attention has no double backward
            gh = torch.autograd.grad(self.loss(m, self.batch(self.h_batch, self.gen)), params, create_graph=True)
            gs = [torch.autograd.grad(self.loss(m, self.batch(self.small, self.gen)), params)
                  for _ in range(self.parts)]
            big = [sum(g[i] for g in gs) / self.parts for i in range(len(params))]

            def h_norm(v):
                hv = torch.autograd.grad(gh, params, grad_outputs=v, retain_graph=True)
                return float(sum((a * b).sum() for a, b in zip(v, hv)))

            q_small = statistics.mean(h_norm(g) for g in gs)
            q_big = h_norm(big)
            # H's top eigenvalue: power iteration, warm-started from the last reading's vector
            v = self.top or [torch.randn(p.shape, generator=self.gen) for p in params]
            lam = 0.0
            for _ in range(POWER_ITERATIONS if self.top is None else POWER_WARM):
                norm = math.sqrt(float(sum((x * x).sum() for x in v)))
                v = [x / norm for x in v]
                hv = torch.autograd.grad(gh, params, grad_outputs=v, retain_graph=True)
                lam = float(sum((a * b).sum() for a, b in zip(v, hv)))
                v = [x.detach() for x in hv]
            self.top = v
        n_small = statistics.mean(float(sum((x * x).sum() for x in g)) for g in gs)
        n_big = float(sum((x * x).sum() for x in big))
        b, bb = self.small, self.small * self.parts
        self.readings.append(((bb * q_big - b * q_small) / (bb - b), (q_small - q_big) / (1 / b - 1 / bb),
                              (bb * n_big - b * n_small) / (bb - b), (n_small - n_big) / (1 / b - 1 / bb), abs(lam)))

    def path(self, window: float = PATH_WINDOW) -> list[tuple[float, float, float, float]]:
        """(|G|^2, G'HG, tr(H Sigma), lambda_max) at every reading, each the mean of the readings within `window`
        of the run on either side (`goodput.centred_means`; one reading is noisy). Not the paper's EMA: it lags,
        and these quantities change tens of times along a run (logistic regression's |G|^2 falls 0.11 -> 0.003
        in 25 steps), so the EMA's path carried readings from earlier, larger gradients."""
        rows = [(r[2], r[0], r[1], r[4]) for r in self.readings]
        return [tuple(x) for x in centred_means(rows, window)]

    def series(self, hessian: bool = True, decay: float = EMA_DECAY) -> list[float | None]:
        """The paper's EMA (of numerator and denominator, then their ratio) after every reading; None while the
        denominator's EMA is not positive (early, H can have negative curvature along G)."""
        i, j = (0, 1) if hessian else (2, 3)
        num = den = 0.0
        out = []
        for r in self.readings:
            num, den = decay * num + r[j], decay * den + r[i]
            out.append(num / den if den > 0 and num > 0 else None)
        return out


def follow(make_model: Callable, loss: Callable, batch: Callable, eval_loss: Callable, batch_size: int, lr: float,
           seed: int, hessian: HessianNoise, steps: int) -> list[float]:
    """`steps` SGD steps of the reference run with the Hessian readings; the evaluation loss before each step and
    after the last."""
    import torch

    m = make_model()
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    losses = [eval_loss(m)]
    for _ in range(steps):
        bt = batch(batch_size, gen)
        opt.zero_grad(set_to_none=True)
        loss(m, bt).backward()
        hessian.read(m)
        opt.step()
        losses.append(eval_loss(m))
    return losses


def to_path(hessian: HessianNoise, losses: list[float], steps_to_target: int, batch_size: int, lr: float,
            target: float, lr_max: float = math.inf, window: float = PATH_WINDOW) -> ReferencePath:
    """The ReferencePath of a followed run: its readings and losses smoothed, the noise (tr(Sigma), tr(H Sigma) /
    tr(Sigma)) read at the target (`steps_to_target`: the run's step there)."""
    at = centred_means([r[:4] for r in hessian.readings], window)[steps_to_target]
    return ReferencePath(hessian.path(window), [x[0] for x in centred_means([(v,) for v in losses], window)],
                         batch_size, lr, at[3], at[1] / at[3], target, lr_max)


def record(make_model: Callable, loss: Callable, batch: Callable, eval_loss: Callable, batch_size: int, lr: float,
           target: float, lr_max: float = math.inf, seed: int = 0, eval_every: int = 1, max_steps: int = 20000,
           past: float = REF_PAST) -> ReferencePath:
    """Train (SGD at `lr`, `batch_size`) until `eval_loss` <= `target` (checked every `eval_every` steps), then the
    same run again for `past` times as many steps further with the readings: the path `goodput.steps_to_target`
    follows. Pick a slow `lr` (the benchmark: an eighth of the largest rate that trains) and a middle batch.
    ValueError when the run does not reach the target in `max_steps`."""
    import torch

    m = make_model()
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    k = None
    for step in range(1, max_steps + 1):
        bt = batch(batch_size, gen)
        opt.zero_grad(set_to_none=True)
        loss(m, bt).backward()
        opt.step()
        if step % eval_every == 0:
            value = eval_loss(m)
            if not math.isfinite(value):
                raise ValueError(f"the reference run diverged at step {step} (lr {lr:g}): use a lower rate")
            if value <= target:
                k = step
                break
    if k is None:
        raise ValueError(f"the reference run did not reach loss {target:g} in {max_steps} steps")
    hess = HessianNoise(loss, batch, small=max(1, batch_size // 8), parts=8, h_batch=4 * batch_size, seed=seed + 7)
    losses = follow(make_model, loss, batch, eval_loss, batch_size, lr, seed, hess, round(k * (1 + past)))
    return to_path(hess, losses, k, batch_size, lr, target, lr_max)
