"""Per-rank memory of data-parallel training: DDP's gradient buckets, and what sharding would save.

A pure function of parameter / gradient / optimizer-state bytes and the world size (no torch needed).

DDP (torch/nn/parallel/distributed.py, torch 2.x): the Reducer copies each gradient into flat
`allreduce` buckets of at most `bucket_cap_mb` = 25 MiB (`_DEFAULT_BUCKET_CAP_MB`), the first bucket
capped at 1 MiB (`dist._DEFAULT_FIRST_BUCKET_BYTES`) so that communication starts early; parameters
are assigned in reverse registration order (the order backward produces their gradients). The buckets
hold a second copy of every gradient, unless `gradient_as_bucket_view=True`: "gradients will be views
pointing to different offsets of allreduce communication buckets ... the saved memory size will be
equal to the total gradients size" (DDP docstring). With `zero_grad(set_to_none=True)` each gradient is
still allocated once in backward before it is copied into its bucket (same docstring, `batched_grad_copy`),
so the saving shows in the memory held after backward, not in every transient.

Sharding (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", §5.1 and Figure 1): with parameters P, gradients G and optimizer state O bytes per replica and
N ranks, per rank
    DDP     P + G + O                  (+ G of buckets without gradient_as_bucket_view)
    ZeRO-1  P + G + O/N                optimizer state partitioned (P_os)
    ZeRO-2  P + (G + O)/N              + gradients partitioned (P_os+g; reduce-scatter instead of allreduce)
    ZeRO-3  (P + G + O)/N              + parameters partitioned (P_os+g+p) = FSDP FULL_SHARD / FSDP2
                                       `fully_shard` (reshard_after_forward=True); each FSDP unit is
                                       all-gathered when used, so add its unsharded size transiently.
Figure 1's example: 7.5B parameters, Adam, mixed precision (P=2Ψ, G=2Ψ, O=12Ψ bytes), N=64 gives
120 GB, 31.4 GB, 16.6 GB and 1.9 GB per rank. Activations are per rank and unchanged by any of these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

MIB = 1024 * 1024
DEFAULT_BUCKET_CAP_MB = 25          # torch/nn/parallel/distributed.py: _DEFAULT_BUCKET_CAP_MB
DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES (1024 * 1024)

# Optimizer state as a multiple of the parameter bytes (torch/optim/*.py: `torch.zeros_like(p)` per
# state buffer; the scalar `step` tensors are ignored here).
OPTIMIZER_STATE_COPIES = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2, "adagrad": 1, "rmsprop": 1}


@dataclass(frozen=True)
class ShardingRow:
    """Per-rank bytes of one strategy."""

    strategy: str
    parameters_bytes: int
    gradients_bytes: int
    buckets_bytes: int
    optimizer_state_bytes: int
    note: str = ""

    @property
    def total_bytes(self) -> int:
        return self.parameters_bytes + self.gradients_bytes + self.buckets_bytes + self.optimizer_state_bytes

    def to_dict(self) -> dict:
        return {"strategy": self.strategy, "parameters_bytes": self.parameters_bytes,
                "gradients_bytes": self.gradients_bytes, "buckets_bytes": self.buckets_bytes,
                "optimizer_state_bytes": self.optimizer_state_bytes, "total_bytes": self.total_bytes,
                "note": self.note}


@dataclass(frozen=True)
class DdpMemoryPlan:
    """Model-state memory per rank (activations excluded) under DDP and the ZeRO/FSDP stages."""

    world_size: int
    parameters_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    bucket_sizes_bytes: list[int] = field(default_factory=list)  # in the order DDP reduces them
    gradient_as_bucket_view: bool = False
    rows: list[ShardingRow] = field(default_factory=list)

    @property
    def buckets_bytes(self) -> int:
        return sum(self.bucket_sizes_bytes)

    def row(self, strategy: str) -> ShardingRow:
        for r in self.rows:
            if r.strategy == strategy:
                return r
        raise KeyError(strategy)

    def to_dict(self) -> dict:
        return {"world_size": self.world_size, "parameters_bytes": self.parameters_bytes,
                "gradients_bytes": self.gradients_bytes, "optimizer_state_bytes": self.optimizer_state_bytes,
                "bucket_count": len(self.bucket_sizes_bytes), "buckets_bytes": self.buckets_bytes,
                "gradient_as_bucket_view": self.gradient_as_bucket_view,
                "rows": [r.to_dict() for r in self.rows]}


def bucket_sizes(param_sizes_bytes: Sequence[int], bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB,
                 first_bucket_bytes: int | None = None) -> list[int]:
    """DDP's steady-state buckets: after the first iteration DDP rebuilds its buckets in the order the
    gradients became ready (about reverse registration order); a bucket closes once it reaches its cap,
    the first bucket's cap being 1 MiB when the default cap is used. Matches
    `dist._compute_bucket_assignment_by_size(reversed(params), [first, cap])` for one dtype, dense grads."""
    cap = int(bucket_cap_mb * MIB)
    if first_bucket_bytes is None:
        first_bucket_bytes = DEFAULT_FIRST_BUCKET_BYTES if bucket_cap_mb == DEFAULT_BUCKET_CAP_MB else cap
    sizes: list[int] = []
    current = 0
    for nbytes in reversed(list(param_sizes_bytes)):
        current += int(nbytes)
        if current >= (first_bucket_bytes if not sizes else cap):
            sizes.append(current)
            current = 0
    if current:
        sizes.append(current)
    return sizes


def optimizer_state_bytes(parameters_bytes: int, optimizer: str) -> int:
    """Optimizer state for a registered optimizer name (see OPTIMIZER_STATE_COPIES)."""
    if optimizer not in OPTIMIZER_STATE_COPIES:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose from: {', '.join(OPTIMIZER_STATE_COPIES)}")
    return OPTIMIZER_STATE_COPIES[optimizer] * parameters_bytes


def plan_ddp(parameters_bytes: int, optimizer_state_bytes: int, world_size: int, *,
             gradients_bytes: int | None = None, param_sizes_bytes: Sequence[int] | None = None,
             bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB, gradient_as_bucket_view: bool = False) -> DdpMemoryPlan:
    """Per-rank model-state bytes for DDP and ZeRO-1/2/3 (FSDP) at `world_size` ranks.

    `gradients_bytes` defaults to `parameters_bytes` (gradients have the parameters' dtype);
    `param_sizes_bytes` (one entry per trainable parameter, registration order) gives the real buckets,
    else one list entry for everything is assumed.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if min(parameters_bytes, optimizer_state_bytes) < 0:
        raise ValueError("byte counts must not be negative")
    p, o, n = int(parameters_bytes), int(optimizer_state_bytes), world_size
    g = p if gradients_bytes is None else int(gradients_bytes)
    buckets = bucket_sizes(param_sizes_bytes if param_sizes_bytes is not None else [g], bucket_cap_mb)
    bucket_copy = 0 if gradient_as_bucket_view else sum(buckets)
    rows = [
        ShardingRow("ddp", p, g, bucket_copy, o,
                    "gradients are views into the buckets" if gradient_as_bucket_view
                    else "buckets hold a second copy of the gradients"),
        ShardingRow("ddp+bucket_view", p, g, 0, o, "DDP(..., gradient_as_bucket_view=True)"),
        ShardingRow("zero1", p, g, 0, _ceil_div(o, n), "optimizer state sharded"),
        ShardingRow("zero2", p, _ceil_div(g, n), 0, _ceil_div(o, n), "+ gradients sharded"),
        ShardingRow("zero3/fsdp", _ceil_div(p, n), _ceil_div(g, n), 0, _ceil_div(o, n),
                    "+ parameters sharded; + one unit gathered at a time"),
    ]
    return DdpMemoryPlan(n, p, g, o, buckets, gradient_as_bucket_view, rows)


def model_state_sizes(model) -> list[int]:
    """Bytes of each trainable parameter of a torch model, in registration order (for `plan_ddp`)."""
    return [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)
