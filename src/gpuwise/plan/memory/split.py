"""The data-parallel strategy spec: how `-n/--nproc N --strategy S` splits a training job over N GPUs.

`Split` names the strategy (single, ddp, zero1, zero2, fsdp = zero3, fsdp1, fsdp-grad-op, hsdp, pipeline),
the ranks and their node size, FSDP2's MixedPrecisionPolicy and when gradients are reduced under
accumulation (`ACCUM_SYNCS`); `SHARDED` the categories each strategy divides by N; `make_split` builds and
checks one from the CLI's options; `comm_bytes_per_step` the bytes a rank moves per step, for the speed
estimate. What a rank holds under a split is plan/memory/sharding.py's transform of the traced step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...errors import GpuwiseError

STRATEGIES = ("single", "ddp", "zero1", "zero2", "fsdp", "fsdp-grad-op", "hsdp", "pipeline")
# when a data-parallel job with gradient accumulation reduces its gradients: on the last micro-step only
# ("last": torch DDP / FSDP1 `no_sync()`, FSDP2 `set_requires_gradient_sync(False)`, Lightning Fabric's
# `no_backward_sync`, HF accelerate's `accumulate()` and the HF Trainer: GradientAccumulationPlugin
# `sync_each_batch=False`, the default) or on every one ("every": accelerate's `sync_each_batch=True`; under
# FSDP, Composer / llm-foundry (composer/trainer/dist_strategy.py `ddp_sync_context`, trainer.py
# `_train_microbatch`) and the Lightning Trainer (`ParallelStrategy.block_backward_sync`), which enter
# `no_sync` only for a DDP model)
ACCUM_SYNCS = ("last", "every")
DEFAULT_NODE_SIZE = 8


@dataclass(frozen=True)
class Split:
    strategy: str = "single"
    nproc: int = 1
    node_size: int = DEFAULT_NODE_SIZE
    flat_params: bool = False  # fsdp1: FSDP1's flat parameters (gradients for a whole unit)
    # FSDP2 MixedPrecisionPolicy: the trace ran 16-bit weights (bf16-pure) and these shards are fp32 master
    # copies (param_dtype set); reduce_dtype: the dtype of the reduce-scatter input (fp32 doubles it)
    param_dtype: str | None = None
    reduce_dtype: str = "fp32"
    accum_sync: str = "last"  # ACCUM_SYNCS: gradients reduced on the last micro-step or on every one

    @property
    def sync_every_micro_step(self) -> bool:
        return self.accum_sync == "every"

    @property
    def master_factor(self) -> int:
        """Bytes of a sharded parameter / gradient / optimizer-state element over the traced (16-bit) one."""
        return 2 if self.param_dtype else 1

    @property
    def reduce_factor(self) -> int:
        """Bytes of a reduce-scatter input element over a traced (16-bit) gradient element."""
        return 2 if self.param_dtype and self.reduce_dtype == "fp32" else 1

    @property
    def shards(self) -> int:
        if self.strategy == "hsdp":
            return min(self.nproc, self.node_size)
        return self.nproc

    @property
    def data_parallel(self) -> int:
        """Ranks that each process their own micro-batch."""
        return 1 if self.strategy == "pipeline" else self.nproc

    def describe(self) -> str:
        if self.strategy == "single":
            return "one GPU"
        return f"{'fsdp1' if self.flat_params else self.strategy} over {self.nproc} GPUs"


SHARDED = {
    "zero1": ("optimizer_state",),
    "zero2": ("optimizer_state", "gradients"),
    "fsdp": ("optimizer_state", "gradients", "parameters"),
    "fsdp-grad-op": ("optimizer_state", "gradients"),
    "hsdp": ("optimizer_state", "gradients", "parameters"),
}


def make_split(nproc: int = 1, strategy: str | None = None, node_size: int = DEFAULT_NODE_SIZE,
               param_dtype: str | None = None, reduce_dtype: str | None = None,
               accum_sync: str | None = None) -> Split:
    """The split that `-n/--nproc N --strategy S` names (S defaults to ddp over N > 1 GPUs). `param_dtype`
    / `reduce_dtype`: FSDP2's MixedPrecisionPolicy (fsdp, hsdp only). `accum_sync`: ACCUM_SYNCS (default
    "last")."""
    split = _make_split(nproc, strategy, node_size, param_dtype, reduce_dtype)
    if accum_sync is None or accum_sync == "last":
        return split
    if accum_sync not in ACCUM_SYNCS:
        raise GpuwiseError(f"--accum-sync {accum_sync!r}: expected one of {', '.join(ACCUM_SYNCS)}")
    if whole(split):
        raise GpuwiseError(f"--accum-sync {accum_sync}: when a data-parallel job reduces its gradients; use -n 2 or "
                           "more with a data-parallel --strategy")
    return replace(split, accum_sync=accum_sync)


def _make_split(nproc: int, strategy: str | None, node_size: int, param_dtype: str | None,
                reduce_dtype: str | None) -> Split:
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise GpuwiseError(f"-n must be a positive integer, got {nproc!r}")
    if strategy is None:
        strategy = "ddp" if nproc > 1 else "single"
    strategy = {"zero3": "fsdp"}.get(strategy, strategy)  # ZeRO-3 is FSDP's sharding (both names are used)
    if param_dtype is not None or reduce_dtype is not None:
        if strategy not in ("fsdp", "fsdp1", "hsdp") or nproc < 2:
            raise GpuwiseError("--fsdp-param-dtype / --fsdp-reduce-dtype: FSDP2's MixedPrecisionPolicy (FSDP1's "
                               "MixedPrecision with fsdp1), with --strategy fsdp, fsdp1 or hsdp over -n 2 or more")
        if param_dtype not in ("bf16",):
            raise GpuwiseError(f"--fsdp-param-dtype {param_dtype!r}: expected bf16 (the reduce dtype needs it)")
        if (reduce_dtype or "fp32") not in ("fp32", "bf16"):
            raise GpuwiseError(f"--fsdp-reduce-dtype {reduce_dtype!r}: expected fp32 or bf16")
        return Split("fsdp" if strategy == "fsdp1" else strategy, nproc, node_size, flat_params=strategy == "fsdp1",
                     param_dtype=param_dtype, reduce_dtype=reduce_dtype or "fp32")
    if strategy == "fsdp1":
        return Split("fsdp", nproc, node_size, flat_params=True)
    if strategy not in STRATEGIES:
        raise GpuwiseError(f"--strategy {strategy!r}: expected one of {', '.join(STRATEGIES)}")
    if strategy == "single" and nproc > 1:
        raise GpuwiseError(f"--strategy single runs on one GPU: use -n 1 or a strategy for {nproc} GPUs")
    return Split(strategy, nproc, node_size)


def whole(split: Split) -> bool:
    """Whether a rank's events under `split` are the traced step's (one GPU; a pipeline stage's trace)."""
    return split.strategy in ("single", "pipeline") or split.nproc == 1


# -- communication per optimizer step (bytes each rank sends), for the speed estimate ----------------

def comm_bytes_per_step(split: Split, param_bytes_16: int, activation_bytes: int = 0) -> int:
    """Bytes one rank moves over its links per step: ring all-reduce 2(N-1)/N x gradients (DDP, ZeRO-1);
    reduce-scatter + all-gather (N-1)/N each (ZeRO-2); FSDP adds a second all-gather of the
    parameters in backward: 3(N-1)/N (ZeRO paper sec. 7: 1.5x DDP's volume). Pipeline: activations
    between stages."""
    n = split.nproc
    if n <= 1 or split.strategy == "single":
        return 0
    ring = (n - 1) / n
    if split.strategy == "pipeline":
        return 2 * activation_bytes
    factor = {"ddp": 2, "zero1": 2, "zero2": 2, "fsdp-grad-op": 2, "fsdp": 3, "hsdp": 3}[split.strategy]
    return int(factor * ring * param_bytes_16)
