"""The gradient noise scale's raw data, read at torch's optimizer-step pre-hook: the gradients of two
consecutive optimizer steps (t, t+1), each a batch of B samples.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", Appendix A) estimate |G|^2 and
tr(Sigma) from gradient norms at two batch sizes B_small < B_big:

    |G|^2    ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    tr(Sigma) ~ (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)

A plain script gives one gradient per step and no smaller one. Two consecutive steps' gradients g_t, g_{t+1}
are two independent batches of B near the same point, and their mean is a batch of 2B. With
B_small = B (|G_small|^2 = (|g_t|^2 + |g_{t+1}|^2) / 2) and B_big = 2B (|G_big|^2 = |g_t + g_{t+1}|^2 / 4)
the two estimators reduce to

    |G|^2     ~ g_t . g_{t+1}                 (unbiased when the two batches' noises are independent)
    tr(Sigma) ~ B |g_t - g_{t+1}|^2 / 2       (unbiased when both steps have the same expected gradient)

so B_simple = tr(Sigma) / |G|^2 ~ B E[|g_t - g_{t+1}|^2 / 2] / E[g_t . g_{t+1}] (ratio of means, as the
paper's EMAs of the two estimates). Bias: the parameters move between t and t+1, by lr x (step t's update):
E[g_t . g_{t+1}] = |G|^2 - lr (G'HG + tr(H Sigma)/B) for plain SGD (H: the Hessian), and the true gradients
differ by lr H g_t, which adds B |lr H G|^2 / 2 to tr(Sigma). Both vanish as lr |H| -> 0 and are small
where a step changes the loss little (stable training). Gradient clipping that binds scales g and biases both;
a step skipped by a GradScaler (inf) is not seen (no optimizer step).

Pairs are (t, t+1), then (t+2+gap, t+3+gap), ...: non-overlapping, so pairs are independent enough for a CI.
`gap` grows when the probe's own host time exceeds `BUDGET_FRACTION` of the steps' time. Large models: the
gradient is read at a fixed stride (at most `MAX_ELEMENTS` values, one copy kept between the two steps),
which estimates |G|^2 and tr(Sigma) on the same coordinates, so their ratio stays consistent when the
coordinates are alike. Results stay as device tensors until `rows()` (one sync per flush, not per step).

Standard library only at import (hooks.py loads this by its file path); torch is passed in.
"""

from __future__ import annotations

import math
import os
import time

ENV_BUDGET = "GPUWISE_NOISE_BUDGET"  # the share of step time the probe may take (default BUDGET_FRACTION)
MAX_ELEMENTS = 1 << 22     # 4M values (16 MiB in fp32) kept between the two steps of a pair
BUDGET_FRACTION = 0.02     # the probe may take at most 2% of the steps' host time (else pairs are spaced) ...
FREE_PAIRS = 128           # ... after the first 128 pairs, read back to back for a first estimate


class NoiseProbe:
    """Call `on_step(opt, batch)` at every optimizer step's pre-hook; `rows()` gives the finished pairs as
    (step, batch, dot, diff2, sq) with dot = g_t.g_{t+1}, diff2 = |g_t - g_{t+1}|^2, sq = (|g_t|^2+|g_{t+1}|^2)/2."""

    def __init__(self, torch, max_elements: int = MAX_ELEMENTS, budget_fraction: float = BUDGET_FRACTION):
        self.torch = torch
        self.max_elements = max_elements
        self.budget_fraction = budget_fraction
        self.key = None          # id of the optimizer whose steps are read (the first seen)
        self.step = 0            # steps of that optimizer seen
        self.first = None        # (step, batch, vector) of a pair's first step
        self.next_at = 0         # the step that starts the next pair
        self.pending: list = []  # (step, batch, dot, diff2, sq) with tensor values
        self.probe_s = 0.0       # host seconds spent in on_step
        self.t_first = None      # perf_counter at the first step
        self.failed = False
        self.opt_name = None     # the class of that optimizer (the learning-rate rule depends on it)
        self.done = 0            # pairs handed out by rows()
        self.last_cost = 0.0     # host seconds of a pair's first step

    def vector(self, opt):
        torch = self.torch
        grads = [p.grad for group in opt.param_groups for p in group["params"]
                 if p.grad is not None and not p.grad.is_sparse]
        if not grads:
            return None
        total = sum(g.numel() for g in grads)
        stride = -(-total // self.max_elements)
        with torch.no_grad():
            parts = [g.detach().reshape(-1) for g in grads]
            if stride > 1:
                parts = [p[(i * 7919) % stride::stride] for i, p in enumerate(parts) if p.numel() > 0]
            return torch.cat([p.float() for p in parts])

    def on_step(self, opt, batch: int) -> None:
        """The pre-hook of an optimizer step that used `batch` samples (0: unknown)."""
        if self.failed:
            return
        t = time.perf_counter()
        if self.t_first is None:
            self.t_first = t
        if self.key is None:
            self.key = id(opt)
            self.opt_name = type(opt).__name__
        elif id(opt) != self.key:
            return
        step = self.step
        self.step += 1
        try:
            if self.first is not None and self.first[0] == step - 1:
                s0, b0, a = self.first
                self.first = None
                b = self.vector(opt)
                if b is not None and b.shape == a.shape and b0 == batch:
                    self.pending.append((s0, batch, a.dot(b), (a - b).square().sum(),
                                         (a.square().sum() + b.square().sum()) / 2))
                cost = time.perf_counter() - t + self.last_cost  # the pair's host time
                per_step = (t - self.t_first) / max(step, 1)
                gap = 0
                if len(self.pending) + self.done > FREE_PAIRS and per_step > 0:
                    gap = int(cost / (self.budget_fraction * per_step)) - 2  # cost <= budget x (2 + gap) steps
                self.next_at = step + 1 + max(gap, 0)
            elif step >= self.next_at:
                a = self.vector(opt)
                self.first = (step, batch, a) if a is not None else None
                self.last_cost = time.perf_counter() - t
            else:
                self.first = None
        except Exception:  # never into the user's script
            self.failed = True
            self.first = None
        self.probe_s += time.perf_counter() - t

    def rows(self) -> list[tuple]:
        """The finished pairs as plain numbers (syncs with the device once), then forgotten."""
        if not self.pending:
            return []
        pending, self.pending = self.pending, []
        self.done += len(pending)
        try:
            values = self.torch.stack([v for r in pending for v in r[2:]]).tolist()
        except Exception:
            return []
        out = [(r[0], r[1], *values[3 * i:3 * i + 3]) for i, r in enumerate(pending)]
        return [r for r in out if all(math.isfinite(v) for v in r[2:])]


def world_size(torch) -> int:
    """Processes whose gradients the step's gradient averages (DDP all-reduces before the step)."""
    try:
        dist = torch.distributed
        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    except Exception:
        return 1


def install(torch, batch_of):
    """Register the pre-hook; `batch_of()` is the samples of the step about to be taken on this process (0:
    unknown), multiplied here by the DDP world size. Returns (probe, the hook's handle), or (None, None) where
    this torch has no global pre-hook."""
    try:
        from torch.optim.optimizer import register_optimizer_step_pre_hook
    except ImportError:
        return None, None
    probe = NoiseProbe(torch, budget_fraction=float(os.environ.get(ENV_BUDGET) or BUDGET_FRACTION))

    def pre_step(opt, args=None, kwargs=None):
        probe.on_step(opt, batch_of() * world_size(torch))

    return probe, register_optimizer_step_pre_hook(pre_step)
