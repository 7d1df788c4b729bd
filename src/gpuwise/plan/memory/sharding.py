"""Per-rank memory across N GPUs: transforms of one traced step, for each way of splitting the job.

The single-GPU trace says when every block lives and what it is (parameters, gradients, optimizer
state, activations, ...). A rank of a data-parallel job runs the same step on its own micro-batch, so
its events are the same with the sharded categories shrunk, plus what the library adds:

    ddp        + DDP's gradient buckets, allocated when DDP wraps the model (a second copy of every
               gradient; plan/memory/ddp.py `plan_ddp`, torch/nn/parallel/distributed.py)
    zero1      optimizer state / N                          (ZeRO stage 1, DeepSpeed `stage: 1`)
    zero2      + gradients / N                              (ZeRO-2; FSDP `SHARD_GRAD_OP` keeps the
                                                             parameters whole from forward to backward)
    fsdp       + parameters / N, + what FSDP2 `fully_shard` (reshard_after_forward=True, one block
    (zero3)    prefetched) holds unsharded, by phase: the root group (embeddings, final norm, head) and two
               blocks in forward; in backward also the head's gradients, one block's gradients and the
               previous block's reduce-scatter input; at the end the root's gradients and their
               reduce-scatter input (`fsdp_gathered_bytes`; without the model's units: 3 averaged blocks);
               what building the model allocated and freed / N (meta-device init, each rank materializes
               its shards: torchtitan train.py's fully_shard + to_empty + init_weights)
    fsdp1      FSDP1 `FullyShardedDataParallel(FULL_SHARD, use_orig_params=True)` as Lightning Fabric and HF
               accelerate wrap: as fsdp, but each unit's parameters are one flat parameter, so a unit holding
               any trainable parameter (a block with LoRA) keeps gradients for all of them
    accumulation (fsdp, fsdp1, fsdp-grad-op, hsdp, micro-steps without gradient sync: FSDP2's
               `set_requires_gradient_sync(False)`, FSDP1's `no_sync()`; `accum_sync="last"`, the default):
               gradients accumulate unsharded on every rank until the last micro-step's reduce-scatter
               (FSDP1 docs, `no_sync`). `accum_sync="every"` (a reduce-scatter every micro-step, as Composer
               runs FSDP: it enters `no_sync` only for a DDP model): only the sharded gradients persist, each
               micro-step's reduce-scatter output added into them (FSDP1 `_accumulate_sharded_grad`, FSDP2
               `foreach_reduce`), as without accumulation
    fsdp-grad-op  FSDP2 `fully_shard(reshard_after_forward=False)`: parameters sharded at rest but all
               unsharded from forward until backward has used them; gradients and state / N
    hsdp       FSDP within a node of `node_size` GPUs, replicated across nodes (HYBRID_SHARD)
    pipeline   N stages of L/N layers (1F1B schedule: the first stage keeps N micro-batches' activations)

Sharding follows Rajbhandari et al. 2020 (ZeRO, sec. 5 and Figure 1) and the FSDP2 docs
(torch.distributed.fsdp.fully_shard: "reshard_after_forward"). Activations are per rank and unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

from ...errors import GpuwiseError
from .events import MemEvent, MemoryTrace, Peak, live_peak

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
FSDP_BLOCKS_IN_FLIGHT = 2  # the block in use and the one prefetched (FSDP2 implicit prefetching)


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
    if _whole(split):
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


def trainable_bytes(trace: MemoryTrace) -> int:
    """Gradient bytes the steady step produces (one per trainable parameter and micro-step)."""
    return sum(e.nbytes for e in trace.events[trace.steady_start:] if e.action == "alloc" and e.category == "gradients")


def block_param_bytes(trace: MemoryTrace, layers: int | None = None, peak: Peak | None = None) -> int:
    """The FSDP unit: a model config's parameters at the peak over its `layers` blocks; a model that is
    not a config: an eighth of them (the largest module's, guessed). `peak`: `live_peak(trace)` when the
    caller has it."""
    params = (peak or live_peak(trace)).by_category.get("parameters", 0)
    return max(params // (layers or 8), 0)


class FsdpUnits(NamedTuple):
    root: float          # share of the parameters outside the repeated blocks (FSDP2's root group)
    after: float         # of those, outside nn.Embedding: taken to run after the blocks
    block: float         # share of the largest block
    blocks_path: str     # dotted path of the blocks' ModuleList ("model.layers")


def fsdp_units(model) -> FsdpUnits | None:
    """The shares of `model`'s parameters that FSDP2 gathers as one unit: (the root's own parameters, i.e.
    everything outside the repeated blocks -- embeddings, final norm, LM head --; those of them outside
    `nn.Embedding`, taken to run after the blocks so that their gradients exist through the blocks'
    backward; one block); None without repeated blocks. `gpuwise train` shards each child of the largest
    ModuleList, then the root (scaleout/fsdp.py `shard`); `model` may be on the meta device."""
    import torch

    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    total = sum(p.numel() for p in model.parameters())
    if not lists or not total:
        return None
    biggest = max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))
    in_blocks = {id(p) for p in biggest.parameters()}
    embedded = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    root = sum(p.numel() for p in model.parameters() if id(p) not in in_blocks)
    after = sum(p.numel() for p in model.parameters() if id(p) not in in_blocks and id(p) not in embedded)
    largest = max(sum(p.numel() for p in b.parameters()) for b in biggest)
    path = next(name for name, m in model.named_modules() if m is biggest)
    return FsdpUnits(root / total, after / total, largest / total, path)


def fsdp_units_of(workload) -> FsdpUnits | None:
    """`fsdp_units` of the workload's model, built on the meta device (no memory); None when it cannot be."""
    import torch

    try:
        with torch.device("meta"):
            model = workload.model_fn()
        return fsdp_units(model)
    except Exception:  # a model that cannot be built on meta: every block is the average (rank_trace)
        return None


def rank_trace(trace: MemoryTrace, split: Split, block_param_bytes: int = 0,
               units: FsdpUnits | None = None, param_bytes: int | None = None,
               accumulating: bool = False) -> MemoryTrace:
    """One rank's events under `split`: the single-GPU trace transformed (the one data-parallel memory
    model; `fit` and `estimate -n N --strategy S` both call it). `units` (`fsdp_units`) sizes FSDP's
    gathered root and blocks exactly; without it every block is `block_param_bytes`. `param_bytes`: the
    whole model's parameter bytes when the trace has fewer layers (fit's 1- and 2-layer traces).
    `accumulating`: more than one micro-step (--grad-accum > 1), reduced as `split.accum_sync` says."""
    if _whole(split):  # one GPU's step as traced: no pass over the events for the gradients
        return trace
    return shard_trace(trace, split, block_param_bytes, trainable_bytes(trace), units, param_bytes, accumulating)


def _whole(split: Split) -> bool:
    """Whether a rank's events under `split` are the traced step's (one GPU; a pipeline stage's trace)."""
    return split.strategy in ("single", "pipeline") or split.nproc == 1


def fsdp_gathered_bytes(param_bytes: int, units: FsdpUnits, n: int,
                        device_type: str, root_grads: bool = True, block_grads: bool = True,
                        reduce_factor: int = 1, accumulate_shards: bool = False) -> dict[str, int]:
    """Bytes FSDP2 holds beyond the shards, by phase (torch 2.x `_fully_shard/_fsdp_param_group.py`
    `pre_forward` / `pre_backward` / `post_backward`, `_fsdp_collectives.py` `foreach_reduce`):
      forward: the root's gathered parameters (all-gathered in the root's pre-forward) + the block in use
        and the one prefetched;
      backward, by where it is in the blocks (L of them, run last to first): throughout, the root's
        parameters (resharded after forward, gathered again in its pre-backward) and the unsharded
        gradients of its parameters that ran after the blocks (LM head, final norm), kept until the
        root's reduce-scatter at the end; and
        `backward_head` (the head's backward): the last block, prefetched in the root's pre-backward;
        `backward_first` (block L-1): that block, the next one prefetched, its unsharded gradients;
        `backward` (a middle block): the same + the previous block's reduce-scatter input (kept until the
          next reduce: `reduce_scatter_max_input_buffers` = 1, freed in `post_backward_rs_wait`);
        `backward_last` (block 0): the block, its gradients, the previous input (nothing to prefetch);
        `backward_only` (the block of a one-block model): the block and its gradients;
        `backward_tail` (after the blocks: the embeddings' backward): block 0's reduce-scatter input;
      end of backward (a spike, the root's `post_backward` after its reshard): the root's unsharded
        gradients, still referenced while `foreach_reduce` copies them into the reduce-scatter input
        (root-sized); on gloo (the CPU target) gloo's `_reduce_scatter_base` clones its input and the
        shard is allocated (measured with the profiler on 2 gloo ranks: + root / N at the root's reduce).
    Measured per phase on 2 gloo ranks (small / hidden-1024 Llama, frees on gloo's threads counted).
    With frozen parameters (LoRA): `root_grads=False` (embeddings and head frozen: no head gradients, no
    root reduce-scatter), `block_grads=False` (FSDP2: a block's frozen parameters get no gradient, its
    adapters' are negligible; FSDP1's flat parameters do get them: True). `reduce_factor`: a reduce-scatter
    input's bytes over the gradient's (2: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), whose
    `foreach_reduce` copies the bf16 gradients into an fp32 input).
    `accumulate_shards`: a micro-step after the first that reduce-scatters (accumulation, `--accum-sync
    every`): a sharded gradient already exists, so each unit's reduce-scatter output (its input / N) is a
    buffer of its own, added into it and then freed (FSDP1 `_reduce_grad` -> `_accumulate_sharded_grad`:
    `_saved_grad_shard += new_sharded_grad`; FSDP2 `foreach_reduce`: `grad += new_sharded_grad`); without an
    accumulated gradient the output becomes the gradient. Measured on 2 gloo ranks (FSDP1, use_orig_params,
    accumulation 2-4 without no_sync): the peak at the root's reduce-scatter is the single step's + root / N."""
    root, after, block = (int(param_bytes * u) for u in units[:3])
    after = after if root_grads else 0
    grad = block if block_grads else 0  # a block's unsharded gradients
    rs = grad * reduce_factor  # ... and its reduce-scatter input
    out = -(-rs // n) if accumulate_shards else 0  # ... and its output, beside the accumulated shard
    end = _root_reduce_bytes(root, n, device_type, reduce_factor) if root_grads else 0
    if root_grads and accumulate_shards:
        end += -(-root * reduce_factor // n)
    return {"forward": root + FSDP_BLOCKS_IN_FLIGHT * block,
            "backward_head": root + after + block,
            "backward_first": root + after + FSDP_BLOCKS_IN_FLIGHT * block + grad,
            "backward": root + after + FSDP_BLOCKS_IN_FLIGHT * block + grad + rs + out,
            "backward_last": root + after + block + grad + rs + out,
            "backward_only": root + after + block + grad,
            "backward_tail": root + after + rs + out,
            "end": end}


def _root_reduce_bytes(root: int, n: int, device_type: str, reduce_factor: int) -> int:
    """The root's `foreach_reduce` (torch 2.x `_fsdp_collectives.py`): its unsharded gradients (`root`
    bytes) are copied into the reduce-scatter input (`root x reduce_factor`), then cleared; the output shard
    (input / n) is allocated after. On gloo (the CPU target) `_reduce_scatter_base` clones its input, so
    input, clone and shard are alive together."""
    rs = root * reduce_factor
    copy_in = root + rs
    return max(copy_in, 2 * rs + -(-rs // n)) if device_type == "cpu" else copy_in


def _backward_units(events: list[MemEvent], blocks_path: str) -> dict[int, tuple[str, str]]:
    """For each backward run (consecutive backward events, keyed by its first index): the first and the
    last block unit it reaches (`blocks_path`'s child names)."""
    runs: dict[int, tuple[str, str]] = {}
    start, first, last = None, "", ""
    for i, e in enumerate([*events, None]):
        if e is not None and e.phase == "backward":
            if start is None:
                start, first, last = i, "", ""
            if e.module.startswith(blocks_path + "."):
                last = e.module[len(blocks_path) + 1:].split(".")[0]
                first = first or last
        elif start is not None:
            runs[start] = (first, last)
            start = None
    return runs


def _hold_by_phase(events: list[MemEvent], steady: int, sizes: dict[str, int],
                   blocks_path: str = "", first_sizes: dict[str, int] | None = None) -> tuple[list[MemEvent], int]:
    """Insert a block of `sizes[phase]` alive through each forward and backward phase (in backward, by
    position: `backward_head` until the first event inside `blocks_path`, `backward_first` inside the
    first block, `backward_last` inside the last (`backward_only` when they are one), `backward_tail`
    after it, `backward` between; events
    outside the blocks in between keep the level they are at), and a spike of `sizes["end"]` where each
    backward ends (every step: warm-up and steady). `first_sizes`: the sizes in each step's first backward
    (FSDP1 accumulating under no_sync: no gradient accumulated yet to add a block's new one into)."""
    out: list[MemEvent] = []
    first_backward = [False, False]  # (this step has had its first backward, it is running now)
    block = _new_block(events)
    held: tuple[str, int, int] | None = None  # (phase, block, nbytes)
    new_steady = steady
    runs = _backward_units(events, blocks_path) if blocks_path else {}

    def release(phase: str) -> None:
        nonlocal held, block
        if held is None:
            return
        was, b, nbytes = held
        out.append(MemEvent("free", b, nbytes, "temporary", phase, "", "FSDP reshard"))
        held = None
        if was.startswith("backward") and sizes.get("end"):
            block += 1
            out.append(MemEvent("alloc", block, sizes["end"], "temporary", "backward", "", "FSDP root reduce-scatter"))
            out.append(MemEvent("free", block, sizes["end"], "temporary", "backward", "", "FSDP root reduce-scatter"))
        block += 1

    run = ("", "")  # this backward's (first, last) block units
    seen_last = [False]

    def key(i: int, e: MemEvent) -> str:
        nonlocal run
        if e.phase != "backward":
            return e.phase
        if i in runs:
            run, seen_last[0] = runs[i], False
        if not blocks_path or not run[0]:
            return "backward"
        if e.module.startswith(blocks_path + "."):
            unit = e.module[len(blocks_path) + 1:].split(".")[0]
            if unit == run[0]:
                if unit == run[1]:
                    seen_last[0] = True
                    return "backward_only"
                return "backward_first"
            if unit == run[1]:
                seen_last[0] = True
                return "backward_last"
            return "backward"
        if seen_last[0]:
            return "backward_tail"
        return held[0] if held is not None and held[0].startswith("backward") else "backward_head"

    for i, e in enumerate(events):
        if i == steady:
            new_steady = len(out)
        if e.phase == "zero_grad":
            first_backward[0] = False
        elif e.phase == "backward" and not first_backward[0]:
            first_backward[:] = [True, True]
        elif e.phase == "forward":
            first_backward[1] = False
        sz = first_sizes if first_sizes is not None and first_backward[1] else sizes
        phase = key(i, e)
        if e.phase in ("forward", "backward"):
            if held is None or held[0] != phase:
                if held is not None and held[0].startswith("backward") and phase == "forward":
                    release(e.phase)  # a new micro-batch's forward after a backward (accumulation)
                elif held is not None:
                    out.append(MemEvent("free", held[1], held[2], "temporary", e.phase, "", "FSDP reshard"))
                    held = None
                    block += 1
                if sz.get(phase):
                    out.append(MemEvent("alloc", block, sz[phase], "temporary", e.phase, "", "FSDP all-gather"))
                    held = (phase, block, sz[phase])
        elif held is not None:
            release(e.phase)
        out.append(e)
    release("backward")
    return out, new_steady


def shard_trace(trace: MemoryTrace, split: Split, block_param_bytes: int = 0,
                gradients_bytes: int = 0, units: FsdpUnits | None = None,
                param_bytes: int | None = None, accumulating: bool = False) -> MemoryTrace:
    """One rank's events under `split` (data-parallel strategies; pipeline is handled by layer count)."""
    s = split.strategy
    if _whole(split):
        return trace
    events = list(trace.events)
    steady = trace.steady_start
    notes = list(trace.notes)
    if s == "ddp":
        # buckets are allocated when DDP wraps the model, before any step: one block at the start
        bucket = MemEvent("alloc", _new_block(events), gradients_bytes, "gradients", "setup", "", "DDP buckets")
        events.insert(0, bucket)
        steady += 1
        notes.append(f"DDP: + {gradients_bytes} bytes of gradient buckets (gradient_as_bucket_view=True removes them)")
    else:
        n = split.shards
        cats = SHARDED[s]
        no_sync = accumulating and not split.sync_every_micro_step and s in ("fsdp", "fsdp-grad-op", "hsdp")
        if accumulating and split.sync_every_micro_step and s in ("fsdp", "fsdp-grad-op", "hsdp"):
            notes.append(f"{'fsdp1' if split.flat_params else s} with accumulation, gradients reduce-scattered every "
                         "micro-step (--accum-sync every): only the sharded gradients persist between micro-steps")
        if no_sync:  # FSDP accumulates unsharded gradients until the last micro-step reduce-scatters them
            cats = tuple(c for c in cats if c != "gradients")
            notes.append(f"{'fsdp1' if split.flat_params else s} with accumulation: gradients accumulate unsharded "
                         "on every rank (no gradient sync between micro-steps: FSDP1 no_sync, FSDP2 "
                         "set_requires_gradient_sync(False))")
        # the optimizer updates only this rank's shard: its temporaries (foreach intermediates) shrink too;
        # under MixedPrecisionPolicy the shards are fp32 masters of the traced 16-bit weights
        f = split.master_factor
        # FSDP materializes only each rank's shards (meta-device init, then fully_shard and to_empty +
        # init_weights: torchtitan train.py; Lightning Fabric's init_module(empty_init=True)): what building
        # the model allocated and freed on the traced device (e.g. fp32 weights cast to bf16) is a rank's 1/N
        built = "parameters" in SHARDED[s]
        events = [replace(e, nbytes=-(-e.nbytes * f // n))
                  if e.category in cats or (e.phase == "optimizer" and e.category == "temporary") else
                  replace(e, nbytes=-(-e.nbytes // n)) if built and e.phase == "setup" and e.category == "temporary"
                  else e for e in events]
        if split.param_dtype:
            notes.append(f"{'FSDP1 MixedPrecision' if split.flat_params else 'FSDP2 MixedPrecisionPolicy'}"
                         f"(param_dtype={split.param_dtype}, reduce_dtype="
                         f"{split.reduce_dtype}): fp32 shards of parameters, gradients and optimizer state (the "
                         f"trace's {split.param_dtype} ones x {f}); parameters gathered and computed in "
                         f"{split.param_dtype}, no autocast; reduce-scatter inputs in {split.reduce_dtype}")
        gathered = 0
        if s in ("fsdp", "hsdp") and units is not None:
            param_total = param_bytes or sum(e.nbytes for e in trace.events
                                             if e.action == "alloc" and e.category == "parameters")
            frozen = trainable_bytes(trace) < param_total // max(n, 1)  # LoRA, freezing: most of it frozen
            sizes = fsdp_gathered_bytes(param_total, units, n, trace.device_type, root_grads=not frozen,
                                        block_grads=split.flat_params or not frozen,
                                        reduce_factor=split.reduce_factor,
                                        accumulate_shards=accumulating and split.sync_every_micro_step)
            if param_bytes:  # a 1- or 2-layer trace standing for the whole model: each of its blocks at the
                for edge in ("backward_last", "backward_only"):  # level of a middle one
                    sizes[edge] = sizes["backward"]
            first = None
            if split.flat_params and no_sync:  # a step's first backward: a block's flat gradient (the cat of its
                # parameters' gradients) becomes the accumulated one, nothing to add it into: no second copy
                first = fsdp_gathered_bytes(param_total, units, n, trace.device_type, root_grads=not frozen,
                                            block_grads=True, reduce_factor=0)
                if param_bytes:
                    for edge in ("backward_last", "backward_only"):
                        first[edge] = first["backward"]
            if split.flat_params and no_sync and not frozen:
                sizes["backward_tail"] += _flat_root_gradient_bytes(param_total, units, notes)
            events, steady = _hold_by_phase(events, steady, sizes, units.blocks_path, first)
            if split.flat_params:
                events, steady = _flat_gradients(events, steady, trace, param_total, units, n, no_sync, notes)
            notes.append(f"{s}: parameters, gradients and optimizer state / {n}; FSDP2 holds unsharded (root "
                         f"{units[0]:.0%} of the parameters, block {units[2]:.0%}) {sizes['forward']} bytes in "
                         f"forward, {sizes['backward']} in backward, {sizes['end']} at the root's reduce-scatter")
        elif s in ("fsdp", "hsdp"):
            gathered = FSDP_BLOCKS_IN_FLIGHT * block_param_bytes + block_param_bytes  # + 1 block of grads
            notes.append(f"{s}: parameters, gradients and optimizer state / {n}; + {FSDP_BLOCKS_IN_FLIGHT} "
                         "blocks' unsharded parameters (all-gather, prefetch) and one block's gradients, each block "
                         "the average of all parameters (the model's root group and blocks were not sized: it was "
                         "not built on the meta device; gpuwise refuses real builds of large configs); with "
                         "torch.autocast its cache keeps every block's 16-bit weight copy through forward "
                         "(MixedPrecisionPolicy(param_dtype=bf16) avoids that: not modelled)")
        elif s == "fsdp-grad-op":
            param_total = sum(e.nbytes for e in trace.events if e.action == "alloc" and e.category == "parameters")
            gathered = param_total - -(-param_total // n)
            notes.append("fsdp-grad-op: parameters unsharded from forward to backward; gradients and state / N")
        else:
            notes.append(f"{s}: {' and '.join(c.replace('_', ' ') for c in cats)} / {n}")
        if gathered:
            events, steady = _hold_during_forward_backward(events, steady, gathered)
    return MemoryTrace(events, steady, trace.device_type, trace.method, notes, trace.flops_per_step,
                       op_costs=trace.op_costs)


def _flat_gradients(events: list[MemEvent], steady: int, trace: MemoryTrace, param_total: int,
                    units: FsdpUnits, n: int, no_sync: bool, notes: list[str]) -> tuple[list[MemEvent], int]:
    """FSDP1 with frozen parameters (LoRA, freezing): a unit's parameters are one flat parameter, which
    requires gradients when any of them does, so the blocks holding a trainable parameter keep gradients
    for all their parameters (torch's `_validate_frozen_params` warns of this memory). Taken: every block
    holds one (LoRA in each block), the root's embeddings and head are frozen. Held from each step's
    first backward to its zero_grad, sharded / N, or whole under accumulation without sync. Measured on 2
    gloo ranks (FSDP1, use_orig_params=True, a 4-block model with a trainable piece in each block): after
    the step each rank keeps the blocks' parameter bytes / 2 of gradients."""
    grads = trainable_bytes(trace)
    if grads >= param_total or not units.block:
        return events, steady  # nothing frozen: the flat gradients are the traced ones
    flat = int(param_total * (1 - units.root)) - grads
    nbytes = flat if no_sync else -(-flat // n)
    if nbytes <= 0:
        return events, steady
    notes.append(f"fsdp1: frozen parameters in the blocks' flat parameters get gradients too: + {nbytes} bytes "
                 f"({'unsharded, accumulating' if no_sync else f'/ {n}'}) from backward to zero_grad")
    if no_sync and units.blocks_path:
        return _hold_growing(events, steady, nbytes, units.blocks_path)
    return _hold_between(events, steady, nbytes, "gradients", lambda ph: ph == "backward",
                         lambda ph: ph == "zero_grad", ("FSDP1 flat gradients", "FSDP1 flat gradients"), "zero_grad")


def _unit_of(module: str, blocks_path: str) -> str | None:
    """The block unit (`blocks_path`'s child name) `module` is in, also under a wrapper's prefix (peft's
    `base_model.model.`); None outside the blocks."""
    at = f".{module}.".find(f".{blocks_path}.")
    if at < 0:
        return None
    return module[at + len(blocks_path) + 1:].split(".")[0] or None


def _hold_growing(events: list[MemEvent], steady: int, nbytes: int, blocks_path: str) -> tuple[list[MemEvent], int]:
    """FSDP1's accumulated flat gradients (`no_sync`), `nbytes` over the blocks: in a step's first backward
    (no gradient accumulated yet) each block's share is allocated as that backward reaches the block (its
    flat gradient is formed when the block's backward runs), so they build up through it; the later
    micro-steps hold them whole from their start; freed at zero_grad (every step: warm-up and steady).
    A block's share is allocated at its first backward event, not when its flat gradient is formed at the
    end of its backward (the `cat` of its weights' gradients, `SplitWithSizesBackward` under
    use_orig_params): in between, those weight gradients (which the trace of frozen weights lacks) build up
    to the same size. A first backward that reaches no block of `blocks_path` allocates them whole at its
    start."""
    runs: dict[int, list[str]] = {}  # each backward run's block units in the order it reaches them
    start = None
    for i, e in enumerate(events):
        if e.phase == "backward":
            if start is None:
                start = i
                runs[i] = []
            unit = _unit_of(e.module, blocks_path)
            if unit is not None and unit not in runs[start]:
                runs[start].append(unit)
        else:
            start = None
    out: list[MemEvent] = []
    block = _new_block(events)
    held: list[tuple[int, int]] = []  # (block, bytes) of this step's pieces
    pending: dict[str, int] = {}      # the first backward's units not reached yet -> their share
    new_steady = steady

    def alloc(size: int) -> None:
        nonlocal block
        out.append(MemEvent("alloc", block, size, "gradients", "backward", "", "FSDP1 flat gradients"))
        held.append((block, size))
        block += 1

    for i, e in enumerate(events):
        if i == steady:
            new_steady = len(out)
        if i in runs and not held and not pending:  # the step's first backward
            units = runs[i]
            if not units:
                alloc(nbytes)
            else:
                share = nbytes // len(units)
                pending = {u: share for u in units}
                pending[units[-1]] += nbytes - share * len(units)
        if pending and e.phase == "backward":
            unit = _unit_of(e.module, blocks_path)
            if unit in pending:
                alloc(pending.pop(unit))
        elif pending and e.phase != "backward":  # left over (a unit the run did not reach again)
            for size in pending.values():
                alloc(size)
            pending = {}
        if e.phase == "zero_grad" and held:
            for b, size in held:
                out.append(MemEvent("free", b, size, "gradients", "zero_grad", "", "FSDP1 flat gradients"))
            held = []
        out.append(e)
    for size in pending.values():
        alloc(size)
    for b, size in held:
        out.append(MemEvent("free", b, size, "gradients", "zero_grad", "", "FSDP1 flat gradients"))
    return out, new_steady


def _flat_root_gradient_bytes(param_total: int, units: FsdpUnits, notes: list[str]) -> int:
    """FSDP1 accumulating without sync (`no_sync`): the root unit's flat gradient. With use_orig_params each
    parameter is a view of the unit's flat parameter (`_use_unsharded_views`: a split of it), so autograd
    forms the flat parameter's gradient in `SplitWithSizesBackward`, a root-sized `cat` of its parameters'
    gradients once the last of them (the embeddings', at the end of backward) exists, and adds it into the
    flat gradient accumulated over the micro-steps. Measured on 2 gloo ranks (FSDP1, use_orig_params=True,
    an embedding, 4 MLP blocks and an untied head, accumulation 2): the step's peak is that `cat`, with the
    head's and the embeddings' gradients alive; a first micro-step without an accumulated gradient takes the
    `cat` as the gradient (no extra)."""
    nbytes = int(param_total * units.root)
    notes.append(f"fsdp1 accumulating: + {nbytes} bytes at the end of backward (the root's flat gradient, a cat "
                 "of its parameters' gradients, added into the accumulated one)")
    return nbytes


def _new_block(events: list[MemEvent]) -> int:
    return max((e.block for e in events), default=-1) + 1


def _hold_during_forward_backward(events: list[MemEvent], steady: int, nbytes: int) -> tuple[list[MemEvent], int]:
    """Insert a block of `nbytes` alive from the first forward event to the end of backward, in every
    step (warm-up and steady)."""
    return _hold_between(events, steady, nbytes, "temporary", lambda ph: ph in ("forward", "backward"),
                         lambda ph: ph not in ("forward", "backward"), ("FSDP all-gather", "FSDP reshard"), "backward")


def _hold_between(events: list[MemEvent], steady: int, nbytes: int, category: str, starts, ends,
                  ops: tuple[str, str], last_phase: str) -> tuple[list[MemEvent], int]:
    """Insert a block of `nbytes` allocated before the first event whose phase `starts` and freed before the
    next whose phase `ends`, in every step (warm-up and steady); one still held at the end is freed there
    (in `last_phase`). `ops`: the alloc's and the free's op names. Returns the events and the new steady
    start."""
    out: list[MemEvent] = []
    block = _new_block(events)
    holding = False
    new_steady = steady
    for i, e in enumerate(events):
        if i == steady:
            new_steady = len(out)
        if starts(e.phase) and not holding:
            out.append(MemEvent("alloc", block, nbytes, category, e.phase, "", ops[0]))
            holding = True
        elif ends(e.phase) and holding:
            out.append(MemEvent("free", block, nbytes, category, e.phase, "", ops[1]))
            holding = False
            block += 1
        out.append(e)
    if holding:
        out.append(MemEvent("free", block, nbytes, category, last_phase, "", ops[1]))
    return out, new_steady


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
