"""Per-rank memory across N GPUs: transforms of one traced step, for each way of splitting the job.

The splits themselves (`Split`, `make_split`) are plan/memory/split.py; FSDP's units and the bytes it holds
unsharded by phase, plan/memory/fsdp_units.py.

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
               reduce-scatter input (`fsdp_gathered_pieces`; without the model's units: 3 averaged blocks);
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

import itertools
from dataclasses import replace

from .events import MemEvent, MemoryTrace
from .fsdp_units import (
    FSDP_BLOCKS_IN_FLIGHT,
    FsdpUnits,
    backward_units,
    flat_root_gradient_bytes,
    fsdp_gathered_pieces,
    unit_at,
    unit_of,
)
from .split import SHARDED, Split, whole


def _gradient_allocs(trace: MemoryTrace) -> list[MemEvent]:
    return [e for e in trace.events[trace.steady_start:] if e.action == "alloc" and e.category == "gradients"]


def trainable_bytes(trace: MemoryTrace) -> int:
    """Gradient bytes the steady step produces (one per trainable parameter and micro-step)."""
    return sum(e.nbytes for e in _gradient_allocs(trace))


def trainable_tensors(trace: MemoryTrace) -> int:
    """Gradient tensors the steady step allocates: one per trainable parameter (later micro-steps accumulate
    into them)."""
    return len(_gradient_allocs(trace))


def rank_trace(trace: MemoryTrace, split: Split, block_param_bytes: int = 0,
               units: FsdpUnits | None = None, param_bytes: int | None = None,
               accumulating: bool = False) -> MemoryTrace:
    """One rank's events under `split`: the single-GPU trace transformed (the one data-parallel memory
    model; `fit` and `estimate -n N --strategy S` both call it). `units` (`fsdp_units`) sizes FSDP's
    gathered root and blocks exactly; without it every block is `block_param_bytes`. `param_bytes`: the
    whole model's parameter bytes when the trace has fewer layers (fit's 1- and 2-layer traces).
    `accumulating`: more than one micro-step (--grad-accum > 1), reduced as `split.accum_sync` says."""
    if whole(split):  # one GPU's step as traced: no pass over the events for the gradients
        return trace
    return shard_trace(trace, split, block_param_bytes, trainable_bytes(trace), units, param_bytes, accumulating)


def _hold_by_phase(events: list[MemEvent], steady: int, pieces: dict[str, tuple[int, ...]],
                   blocks_paths: tuple[str, ...] = (), first_pieces: dict[str, tuple[int, ...]] | None = None,
                   ) -> tuple[list[MemEvent], int]:
    """Insert blocks of `pieces[phase]` (one block a tensor FSDP holds: `fsdp_gathered_pieces`) alive through
    each forward and backward phase (in backward, by position: `backward_head` until the first event inside
    `blocks_paths`, `backward_first` inside the first block, `backward_last` inside the last (`backward_only`
    when they are one), `backward_tail` after it, `backward` between; events outside the blocks in between keep
    the level they are at), and a spike of `pieces["end"]` where each backward ends (every step: warm-up and
    steady). `first_pieces`: those in each step's first backward (FSDP1 accumulating under no_sync: no gradient
    accumulated yet to add a block's new one into)."""
    out: list[MemEvent] = []
    first_backward = [False, False]  # (this step has had its first backward, it is running now)
    ids = itertools.count(_new_block(events))
    held: tuple[str, list[tuple[int, int]]] | None = None  # (phase, [(block, nbytes)])
    new_steady = steady
    runs = backward_units(events, blocks_paths) if blocks_paths else {}
    end = sum(pieces.get("end", ()))  # the root's reduce-scatter spike

    def free_held(phase: str) -> None:
        nonlocal held
        for b, nbytes in held[1]:
            out.append(MemEvent("free", b, nbytes, "temporary", phase, "", "FSDP reshard"))
        held = None

    def release(phase: str) -> None:
        if held is None:
            return
        was = held[0]
        free_held(phase)
        if was.startswith("backward") and end:
            b = next(ids)
            out.append(MemEvent("alloc", b, end, "temporary", "backward", "", "FSDP root reduce-scatter"))
            out.append(MemEvent("free", b, end, "temporary", "backward", "", "FSDP root reduce-scatter"))

    run = ("", "")  # this backward's (first, last) block units
    seen_last = [False]

    def key(i: int, e: MemEvent) -> str:
        nonlocal run
        if e.phase != "backward":
            return e.phase
        if i in runs:
            run, seen_last[0] = runs[i], False
        if not blocks_paths or not run[0]:
            return "backward"
        unit = unit_at(e.module, blocks_paths)
        if unit is not None:
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
        now = first_pieces if first_pieces is not None and first_backward[1] else pieces
        phase = key(i, e)
        if e.phase in ("forward", "backward"):
            if held is None or held[0] != phase:
                if held is not None and held[0].startswith("backward") and phase == "forward":
                    release(e.phase)  # a new micro-batch's forward after a backward (accumulation)
                elif held is not None:
                    free_held(e.phase)
                if now.get(phase):
                    held = (phase, [(next(ids), nbytes) for nbytes in now[phase]])
                    out.extend(MemEvent("alloc", b, nbytes, "temporary", e.phase, "", "FSDP all-gather")
                               for b, nbytes in held[1])
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
    if whole(split):
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
            pieces = fsdp_gathered_pieces(param_total, units, n, trace.device_type, root_grads=not frozen,
                                          block_grads=split.flat_params or not frozen,
                                          reduce_factor=split.reduce_factor,
                                          accumulate_shards=accumulating and split.sync_every_micro_step)
            if param_bytes:  # a 1- or 2-layer trace standing for the whole model: each of its blocks at the
                for edge in ("backward_last", "backward_only"):  # level of a middle one
                    pieces[edge] = pieces["backward"]
            first = None
            if split.flat_params and no_sync:  # a step's first backward: a block's flat gradient (the cat of its
                # parameters' gradients) becomes the accumulated one, nothing to add it into: no second copy
                first = fsdp_gathered_pieces(param_total, units, n, trace.device_type, root_grads=not frozen,
                                             block_grads=True, reduce_factor=0)
                if param_bytes:
                    for edge in ("backward_last", "backward_only"):
                        first[edge] = first["backward"]
            if split.flat_params and no_sync and not frozen:
                root_flat = flat_root_gradient_bytes(param_total, units, notes)
                pieces["backward_tail"] += (root_flat,) if root_flat else ()
            events, steady = _hold_by_phase(events, steady, pieces, units.blocks_paths, first)
            sizes = {phase: sum(held) for phase, held in pieces.items()}
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
    if no_sync and units.blocks_paths:
        return _hold_growing(events, steady, nbytes, units.blocks_paths)
    return _hold_between(events, steady, nbytes, "gradients", lambda ph: ph == "backward",
                         lambda ph: ph == "zero_grad", ("FSDP1 flat gradients", "FSDP1 flat gradients"), "zero_grad")


def _hold_growing(events: list[MemEvent], steady: int, nbytes: int,
                  blocks_paths: tuple[str, ...]) -> tuple[list[MemEvent], int]:
    """FSDP1's accumulated flat gradients (`no_sync`), `nbytes` over the blocks: in a step's first backward
    (no gradient accumulated yet) each block's share is allocated as that backward reaches the block (its
    flat gradient is formed when the block's backward runs), so they build up through it; the later
    micro-steps hold them whole from their start; freed at zero_grad (every step: warm-up and steady).
    A block's share is allocated at its first backward event, not when its flat gradient is formed at the
    end of its backward (the `cat` of its weights' gradients, `SplitWithSizesBackward` under
    use_orig_params): in between, those weight gradients (which the trace of frozen weights lacks) build up
    to the same size. A first backward that reaches no block of `blocks_paths` allocates them whole at its
    start."""
    runs: dict[int, list[str]] = {}  # each backward run's block units in the order it reaches them
    start = None
    for i, e in enumerate(events):
        if e.phase == "backward":
            if start is None:
                start = i
                runs[i] = []
            unit = unit_of(e.module, blocks_paths)
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
            unit = unit_of(e.module, blocks_paths)
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
