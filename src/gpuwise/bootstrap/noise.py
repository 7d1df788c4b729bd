"""The gradient noise scale's raw data, read with torch's global hooks while the user's script trains.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", Appendix A) estimate |G|^2 and
tr(Sigma) from gradient norms at two batch sizes B_small < B_big:

    |G|^2     ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    tr(Sigma) ~ (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)

Both are unbiased when the two norms come from the same point. Two ways to get them without a code change:

1. per-example (`ExampleProbe`, preferred): B_small = 1, B_big = B, in the same step. A global module forward
   hook (`register_module_forward_hook`, active only on probed steps) sees each `nn.Linear`'s input a; a hook on
   its output's gradient d gives each example's weight-gradient norm in closed form (Goodfellow 2015,
   "Efficient per-example gradient computations"): |a_i|^2 |d_i|^2 for (B, in) inputs, sum((A_i A_i^T) o
   (D_i D_i^T)) for (B, T, in) ones, plus |sum_t d_it|^2 for the bias. |G_B|^2 is the parameters' own .grad,
   read when autograd has accumulated it (`register_post_accumulate_grad_hook`: before a GradScaler unscales
   it, before clipping, summed over gradient-accumulation micro-batches). Whatever the loss reduction (mean,
   sum, / accumulation steps) scales both norms alike, so the ratio is unaffected. Covers the trainable
   `nn.Linear` layers (the rest of the model is not in the estimate); assumes dim 0 is the batch and that a
   layer is applied once per example (weight sharing across calls adds cross terms this leaves out).
2. consecutive steps (`PairProbe`, fallback when no Linear layer trains, e.g. a pure CNN): g_t and g_{t+1}
   as two batches of B, their mean as one of 2B, which reduces to |G|^2 ~ g_t . g_{t+1} and
   tr(Sigma) ~ B |g_t - g_{t+1}|^2 / 2. Biased by the step between them: for SGD,
   E[g_t . g_{t+1}] = |G|^2 - lr (G'HG + tr(H Sigma)/B), which at a well-tuned learning rate with B below the
   noise scale is as large as |G|^2 itself (measured: negative estimates on logistic regression at lr 1).
   Valid only where lr x curvature x B_simple / B << 1; the summary says which estimator it used.

Rows: (step, batch, g2, tr_b, estimator) with g2 an estimate of |G|^2 and tr_b of tr(Sigma) / batch, in the
script's own (consistent) gradient scale. Probed steps are spaced so that the probes' host time stays under
`BUDGET_FRACTION` of the steps' time, after the first `FREE_STEPS` steps. Values stay device tensors until
`rows()` (one sync per flush). Standard library only at import (hooks.py loads this by its file path).
"""

from __future__ import annotations

import math
import os
import time

ROW_KEYS = ("step", "batch", "g2", "tr_b", "estimator")  # `Timeline.noise` records, in `rows()` order
ENV_BUDGET = "GPUWISE_NOISE_BUDGET"  # the share of step time the probes may take (default BUDGET_FRACTION)
BUDGET_FRACTION = 0.02     # probes may take at most 2% of the steps' host time (else probed steps are spaced) ...
FREE_STEPS = 64            # ... after the first 64 steps, probed back to back for a first estimate
# A probed step cost +0.9 ms on a 400 us MLP step (100-32-32-16, batch 32) and +2.4 ms on a 15 ms one (width 512,
# batch 64), one CPU thread on a loaded 2-core machine: the budget spaces them ~115 and ~8 steps apart.
MAX_ELEMENTS = 1 << 22     # consecutive steps: 4M values (16 MiB in fp32) kept between the two steps


class ExampleProbe:
    """Per-example gradient norms of the trainable nn.Linear layers, on armed steps."""

    def __init__(self, torch):
        self.torch = torch
        self.handle = None           # the global forward hook while armed
        self.param_hooks: list = []
        self.total = None            # sum over examples of |c_i|^2 (tensor)
        self.rows: dict = {}         # id(module) -> examples seen this step
        self.grad_sq: dict = {}      # id(param) -> |p.grad|^2 (tensor), latest accumulation
        self.params: dict = {}       # id(param) -> param, covered this step
        self.covered_once = False
        self.hook_s = 0.0            # host seconds in the backward hooks since the last finish

    def arm(self) -> None:
        if self.handle is None:
            self.handle = self.torch.nn.modules.module.register_module_forward_hook(self.forward_hook)

    def disarm(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
        for h in self.param_hooks:
            h.remove()
        self.param_hooks = []

    def forward_hook(self, module, args, output):
        torch = self.torch
        if not isinstance(module, torch.nn.Linear) or not args or not torch.is_grad_enabled():
            return None
        a = args[0]
        w, b = module.weight, module.bias
        if not isinstance(a, torch.Tensor) or a.dim() < 2 or not getattr(output, "requires_grad", False) \
                or not w.requires_grad:
            return None
        a = a.detach()  # autograd keeps it for the weight gradient anyway
        with_bias = b is not None and b.requires_grad
        output.register_hook(lambda d: self.backward(module, a, d, with_bias))
        for p in (w, b) if with_bias else (w,):
            if id(p) not in self.params:
                self.params[id(p)] = p
                self.param_hooks.append(p.register_post_accumulate_grad_hook(self.accumulated))
        return None

    def accumulated(self, p) -> None:
        if p.grad is not None:
            self.grad_sq[id(p)] = p.grad.detach().float().square().sum()

    def backward(self, module, a, d, with_bias: bool) -> None:
        torch = self.torch
        t = time.perf_counter()
        try:
            with torch.no_grad():
                n = a.shape[0]
                a, d = a.float(), d.float()
                if a.dim() == 2:
                    dd = d.square().sum(1)
                    sq = (a.square().sum(1) * dd).sum() + (dd.sum() if with_bias else 0.0)
                else:
                    A, D = a.reshape(n, -1, a.shape[-1]), d.reshape(n, -1, d.shape[-1])
                    t, i, o = A.shape[1], A.shape[2], D.shape[2]
                    if t * t <= i * o:  # Gram matrices: B T^2 (in + out), not B in out
                        sq = (torch.bmm(A, A.transpose(1, 2)) * torch.bmm(D, D.transpose(1, 2))).sum()
                    else:
                        sq = torch.bmm(D.transpose(1, 2), A).square().sum()
                    if with_bias:
                        sq = sq + D.sum(1).square().sum()
                self.total = sq if self.total is None else self.total + sq
                self.rows[id(module)] = self.rows.get(id(module), 0) + n
        except Exception:
            pass
        self.hook_s += time.perf_counter() - t
        return None

    def finish(self):
        """(examples, sum |c_i|^2, |sum c_i|^2) of the step that just ended, or None; resets."""
        out = None
        if self.total is not None and self.rows and self.grad_sq:
            self.covered_once = True
            out = (min(self.rows.values()), self.total, sum(self.grad_sq.values()))
        self.total, self.rows, self.grad_sq, self.params = None, {}, {}, {}
        return out


class PairProbe:
    """Gradients of two consecutive steps (see the module docstring: biased by the step between them)."""

    def __init__(self, torch, max_elements: int = MAX_ELEMENTS):
        self.torch = torch
        self.max_elements = max_elements
        self.first = None  # (step, batch, vector)

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
            if stride > 1:  # a fixed stride: |G|^2 and tr(Sigma) on the same coordinates
                parts = [p[(i * 7919) % stride::stride] for i, p in enumerate(parts) if p.numel() > 0]
            return torch.cat([p.float() for p in parts])


class NoiseProbe:
    """Call `on_step(opt, batch)` at every optimizer step's pre-hook; `rows()` gives the finished estimates."""

    def __init__(self, torch, budget_fraction: float = BUDGET_FRACTION, free_steps: int = FREE_STEPS):
        self.torch = torch
        self.budget_fraction = budget_fraction
        self.free_steps = free_steps
        self.examples = ExampleProbe(torch)
        self.pairs = PairProbe(torch)
        self.key = None          # id of the optimizer whose steps are read (the first seen)
        self.opt_name = None     # its class (the learning-rate rule depends on it)
        self.step = 0            # steps of that optimizer seen
        self.next_at = 0         # the next step to probe
        self.pending: list = []  # (step, batch, g2, tr_b, estimator) with tensor values
        self.probe_s = 0.0       # host seconds spent probing
        self.t_first = None
        self.failed = False
        self.mode = "examples"   # -> "pairs" when the first probed step covered no Linear layer
        self.examples.arm()      # the first step's forward comes before any pre-hook

    def on_step(self, opt, batch: int) -> None:
        """The pre-hook of an optimizer step that used `batch` samples (0: unknown)."""
        if self.failed:
            return
        t = time.perf_counter()
        if self.key is None:
            self.key, self.opt_name, self.t_first = id(opt), type(opt).__name__, t
        elif id(opt) != self.key:
            return
        step = self.step
        self.step += 1
        try:
            probed = self._example_step(step) if self.mode == "examples" else self._pair_step(opt, step, batch)
            if probed:
                cost = time.perf_counter() - t + self.armed_cost + self.examples.hook_s
                self.examples.hook_s = 0.0
                per_step = (t - self.t_first) / max(step, 1)
                gap = 0
                if step >= self.free_steps and per_step > 0:
                    gap = int(cost / (self.budget_fraction * per_step)) - 1  # cost <= budget x (1 + gap) steps
                self.next_at = step + 1 + max(gap, 0)
            if self.mode == "examples" and step + 1 >= self.next_at:
                self.examples.arm()  # the next step's forward and backward are read
        except Exception:  # never into the user's script
            self.failed = True
            self.examples.disarm()
        self.probe_s += time.perf_counter() - t

    armed_cost = 0.0

    def _example_step(self, step: int) -> bool:
        ex = self.examples
        if ex.handle is None:
            return False
        ex.disarm()
        got = ex.finish()
        if got is None:
            if not ex.covered_once:
                self.mode = "pairs"  # no trainable nn.Linear: fall back to consecutive steps
            return True
        n, sum_sq, grad_sq = got
        if n < 2:
            return True
        # This process's examples and its own .grad (read before DDP's all-reduce writes the average back):
        # Appendix A with B_small = 1, B_big = n: |G|^2 = (n |G_n|^2 - |G_1|^2)/(n - 1), tr(S) = (|G_1|^2 - |G_n|^2) n/(n - 1)
        g1 = sum_sq / n                      # |G_1|^2: the mean per-example squared norm
        gn = grad_sq / (n * n)               # |G_n|^2: the squared norm of their mean
        g2 = (n * gn - g1) / (n - 1)
        tr = (g1 - gn) * n / (n - 1)
        big = n * world_size(self.torch)     # the step's global batch (the finding compares it with B_simple)
        self.pending.append((step, big, g2, tr / big, "per-example"))
        return True

    def _pair_step(self, opt, step: int, batch: int) -> bool:
        pp = self.pairs
        if pp.first is not None and pp.first[0] == step - 1:
            s0, b0, a = pp.first
            pp.first = None
            b = pp.vector(opt)
            if b is not None and b.shape == a.shape and b0 == batch:
                self.pending.append((s0, batch, a.dot(b), (a - b).square().sum() / 2, "consecutive-steps"))
            return True
        if step >= self.next_at:
            t = time.perf_counter()
            a = pp.vector(opt)
            pp.first = (step, batch, a) if a is not None else None
            self.armed_cost = time.perf_counter() - t
        else:
            pp.first = None
        return False

    def rows(self) -> list[tuple]:
        """The finished estimates as plain numbers (syncs with the device once), then forgotten."""
        if not self.pending:
            return []
        pending, self.pending = self.pending, []
        torch = self.torch
        try:
            values = torch.stack([torch.as_tensor(v, dtype=torch.float32).reshape(()) for r in pending
                                  for v in r[2:4]]).tolist()
        except Exception:
            return []
        out = [(r[0], r[1], values[2 * i], values[2 * i + 1], r[4]) for i, r in enumerate(pending)]
        return [r for r in out if math.isfinite(r[2]) and math.isfinite(r[3])]


def world_size(torch) -> int:
    """Processes whose gradients the step's gradient averages (DDP all-reduces before the step)."""
    try:
        dist = torch.distributed
        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    except Exception:
        return 1


def install(torch, batch_of):
    """Register the pre-hook; `batch_of()` is the samples of the step about to be taken on this process (0:
    unknown), multiplied by the DDP world size for the consecutive-steps estimator. Returns (probe, a handle
    whose remove() undoes it all), or (None, None) where this torch has no global pre-hook."""
    try:
        from torch.optim.optimizer import register_optimizer_step_pre_hook
    except ImportError:
        return None, None
    budget = float(os.environ.get(ENV_BUDGET) or BUDGET_FRACTION)
    if budget <= 0:  # GPUWISE_NOISE_BUDGET=0: no probe (tune's throughput trials)
        return None, None
    probe = NoiseProbe(torch, budget_fraction=budget)

    def pre_step(opt, args=None, kwargs=None):
        probe.on_step(opt, batch_of() * world_size(torch))

    return probe, _Handles(register_optimizer_step_pre_hook(pre_step), probe)


class _Handles:
    def __init__(self, handle, probe: NoiseProbe):
        self.handle, self.probe = handle, probe

    def remove(self) -> None:
        self.handle.remove()
        self.probe.examples.disarm()
