"""A deep model's step from a 3-layer trace: the events of L identical blocks, rebuilt exactly.

A model config with L repeated blocks (a decoder's layers) runs the same ops in every block: the step's
events are the embeddings' and head's, and in each phase a run over the blocks (ascending in forward and
in the optimizer's per-parameter loops, descending in backward). Tracing 80 blocks with fake tensors
costs 80 times one block; here the model is traced with 3 blocks (first, middle, last: a first or last
block can differ from the others, e.g. in what it frees of its neighbour) and each phase's run is
rebuilt for L blocks: block 0 from the first, blocks 1..L-2 from the middle one, block L-1 from the last.
Events are tagged with their block while tracing (plan/tracing/repeat_tags.py); an event that refers to a
storage of another block (a backward freeing the previous block's saved output) keeps its distance.

Blocks of several kinds in a repeating pattern (Gemma-2's sliding and global attention alternating, SmolLM3's
block without RoPE every fourth, Qwen3-Next's full attention after three linear ones, dense blocks before
mixture-of-experts ones) are rebuilt the same way by units (plan/tracing/repeat_tags.py `Units`): unit 0 is the
blocks before the pattern (and as many more as leave whole periods), every later unit one period of blocks; the
model is traced with its first 3 and 4 units' blocks, and "block" below reads "unit" (plan/tracing/alike.py `block_units`).

An encoder-decoder whose two stacks are equally deep (T5, BART, Marian, Pegasus: two lists of L blocks) is cut in
both (hf.set_num_layers): block i is both stacks' i-th, and each phase runs over the blocks twice (the encoder's,
then the decoder's; in backward the other way round), each run rebuilt as above. Two kinds of storage cross the
runs' neighbours otherwise than every block's does (`_across`): a gradient summed over the blocks (the encoder's
output, which every decoder block reads: the last block makes the first sum, every other block the second) and a
storage the first block makes that every block holds (T5's position bias, saved by every checkpointed block: freed
once, by the last holder).

When is that exact? When every one of the L blocks is built alike (checked on the full-depth model built
on the meta device: module types, parameter shapes and dtypes, plain attributes except the block's
index, e.g. a sliding-window flag set per layer), and the rebuild reproduces a real trace: the
4-layer model is traced too and must come out event for event as rebuilt from the 3-layer one (sizes,
categories, phases, modules, ops, and which free ends which allocation). Otherwise the model is traced
whole, and the estimate says why. tests/test_plan_repeat.py compares rebuilt and full traces of
decoders (byte-exact peaks) and checks that blocks which differ are traced whole.

FLOPs are per-op sums: L blocks' FLOPs are the 3-layer trace's plus (L - 3) times the difference
between the 4- and 3-layer traces; the op costs (the speed model's input) the same way.

Another micro-batch of a step already checked needs only its 3-layer trace (`fit` asks a step at several):
the 4-layer check is of the blocks' structure, which the batch does not change, and one more block's costs
are the 3-layer trace's middle block's (its ops tagged while tracing) plus what the check measured beyond
them (`BlockResidual`: the optimizer's loops over one more block's parameters, which no batch changes; where
the forward or backward adds bytes or FLOPs outside the middle block's tags, there is no residual to reuse and
every micro-batch is checked). tests/test_plan_repeat.py checks that such a rebuild equals the checked one.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...hf import num_layers_of, with_layers
from ...step import StepConfig
from ..memory.events import MemEvent, MemoryTrace, event_rows, events_from_rows
from ..speed.ops import OpCosts
from .alike import block_units
from .repeat_tags import CHECKED, MIN_LAYERS, ONE, TRACED, Units, block_at

BATCH_FREE_PHASES = {"optimizer", "zero_grad"}  # phases whose ops no micro-batch changes
# OpCosts parts that count launches and dispatches (a fusing compiler's kernels and the eager ones they replace,
# plan/speed/fusion.py, too): the code's, not the batch's
COUNTS = ("kernels", "host_ops", "fused_kernels", "memory_kernels")


@dataclass(frozen=True)
class BlockResidual:
    """What one more block adds to a step besides its middle block's tagged ops, where a 4-block check ran
    (at `micro_batch`): the 4-block trace's op costs and FLOPs less the 3-block trace's and its middle block's."""

    costs: OpCosts
    flops: int
    micro_batch: int


def block_residual(three: MemoryTrace, four: MemoryTrace, micro_batch: int) -> BlockResidual | None:
    """The residual of a checked rebuild, or None where it holds sizes of other phases than the optimizer's and
    zero_grad's (a forward or backward op outside the middle block's tags could change with the batch; how many
    ops it dispatches and kernels it launches do not: autograd's accumulation of a block's gradient runs in no
    block's module)."""
    middle = getattr(three, "middle_costs", None)
    if middle is None or three.op_costs is None or four.op_costs is None:
        return None
    costs = four.op_costs.added(three.op_costs, -1).added(middle, -1)
    if costs.phases(tuple(p for p in OpCosts.PARTS if p not in COUNTS)) - BATCH_FREE_PHASES:
        return None
    return BlockResidual(costs, four.flops_per_step - three.flops_per_step - three.middle_flops, micro_batch)


class NotRepeating(Exception):
    """The events cannot be rebuilt from the traced blocks (the message says why)."""


def _moved(module: str, prefixes: tuple[str, ...], shift: int) -> str:
    """`module` with its block index moved by `shift` (unchanged outside the blocks)."""
    at = block_at(module, prefixes) if shift else None
    if at is None:
        return module
    prefix, j, rest = at
    return prefix + str(j + shift) + ("." + rest if rest else "")


def rebuild(trace: MemoryTrace, layers: int) -> MemoryTrace:
    """The events of the same step with `layers` blocks, from `trace` (traced with 3, events tagged)."""
    rows, steady, made = _rebuilt_rows(trace, layers)
    out = MemoryTrace(events_from_rows(rows), steady, trace.device_type, trace.method, list(trace.notes),
                      trace.flops_per_step)
    out.optimizer_made_at = made
    return out


def _rebuilt_rows(trace: MemoryTrace, layers: int) -> tuple[list[tuple], int, int | None]:
    """`rebuild`'s events as rows of MemEvent's fields in order (no objects yet: the 4-block check compares
    them as they are), where the steady step starts, and where the optimizer was made (`optimizer_made_at`:
    the first event after it; None where the trace does not say)."""
    info = trace.layers
    if info is None or info.count != TRACED:
        raise NotRepeating("the trace has no block tags")
    if layers < TRACED:
        raise NotRepeating(f"{layers} blocks: fewer than the traced {TRACED}")
    events, tags, block_layer, prefix = trace.events, info.event_layer, info.block_layer, info.prefixes
    units = info.units
    begins = units.start  # a unit's first block: module names move by blocks, the rebuild by units
    last = TRACED - 1

    # a storage of block i is known by what it is and the how-manieth such it is in its block: the same
    # storage of another block has the same role (the 4-block check proves the pairing). Roles are numbered
    # (equal roles, equal numbers) so that a storage's key in the rebuild is one int: block * roles + role.
    # Units of blocks: modules are named from their unit's start, unit 0's from where it would start if it were
    # a period long (it ends as a period does: its last block's output is what the next unit's backward frees)
    role: dict[int, int] = {}
    numbered: dict[tuple, int] = {}
    seen: dict[tuple, int] = {}
    for e in events:
        if e.action == "alloc":
            i = block_layer.get(e.block)
            if i is not None:
                moved_by = units.period - units.first if i == 0 else -begins(i)
                what = (e.nbytes, e.category, e.phase, e.op, _moved(e.module, prefix, moved_by))
                seen[(i, what)] = seen.get((i, what), -1) + 1
                role[e.block] = numbered.setdefault((what, seen[(i, what)]), len(numbered))
    for e in events:  # storages freed but not allocated in the trace: a role each
        if e.block not in role and block_layer.get(e.block) is not None:
            role[e.block] = numbered.setdefault(("not allocated", e.block), len(numbered))
    roles = len(numbered)

    chunks = _chunks(events, tags)
    as_middle, pinned = _across(chunks, events, block_layer, role)
    out: list[tuple] = []
    ids: dict = {}   # a storage's key (an int inside the blocks, ("outside", block) outside) -> its new block
    freed: set[int] = set()
    names: dict[int, dict[str, str]] = {}  # shift -> module -> the module moved by the shift
    steady = made = None
    made_at = getattr(trace, "optimizer_made_at", None)
    for c, (t, start, end) in enumerate(chunks):
        if t is None or t == 0:
            targets = [t]
        elif t == last:
            targets = [layers - 1]
        else:
            before = chunks[c - 1][0] if c > 0 else None
            after = chunks[c + 1][0] if c + 1 < len(chunks) else None
            up, down = before == 0 or after == last, before == last or after == 0
            if up == down:
                raise NotRepeating(f"events of the middle block at {start} are not in a run over the blocks")
            targets = list(range(1, layers - 1)) if up else list(range(layers - 2, 0, -1))
        # what does not depend on the target, once per event of the chunk:
        # (alloc?, owner or None, block it refers to when not a neighbour's (fixed) or None, (role, the role
        #  it has where a middle block holds it or None, pinned?), fixed shift of its module or None, the event)
        plan = []
        for i, e in enumerate(events[start:end], start):
            owner = block_layer.get(e.block)
            if owner is None:
                plan.append((e.action == "alloc", None, None, ("outside", e.block), None, e))
                continue
            # a neighbour keeps its distance; the first or last block seen from the other end (a storage
            # kept from the last block's backward to the first's, e.g. accumulated adapters' gradients)
            # stays the first or last, and so does the first block's storage every block holds (`_across`)
            near = t is not None and abs(owner - t) <= 1 and i not in pinned
            fixed = None if near else 0 if owner == 0 else layers - 1 if owner == last else -1
            # freed by its last reference: named by where it was made
            moved = begins(fixed) - begins(owner) if fixed is not None and e.action == "free" and not e.op else None
            # the first or last block's storage that a neighbour frees: a middle block's where the rebuild puts one
            middle = as_middle.get(role[e.block]) if fixed is None and owner in (0, last) else None
            plan.append((e.action == "alloc", owner, fixed, (role[e.block], middle, i in pinned), moved, e))
        for target in targets:
            shift = 0 if t is None else target - t
            name_shift = 0 if t is None else begins(target) - begins(t)
            if steady is None and start <= trace.steady_start < end:
                steady = len(out) + trace.steady_start - start
            if made is None and made_at is not None and start <= made_at < end:
                made = len(out) + made_at - start
            here = names.setdefault(name_shift, {})
            for alloc, owner, fixed, key, moved, e in plan:
                once = owner is None or key[2]
                if once and len(targets) > 1 and target != targets[0 if alloc else -1]:
                    continue  # a storage of no block (or pinned), made or freed in a run: once, at its start or end
                if owner is not None:
                    at = owner + shift if fixed is None else fixed
                    if not 0 <= at < layers:
                        raise NotRepeating(f"an event refers to block {at} of {layers}")
                    own, middle, _ = key
                    key = at * roles + (middle if middle is not None and 0 < at < layers - 1 else own)
                if alloc:
                    if key in ids:
                        raise NotRepeating("a storage would be allocated twice")
                    block = ids[key] = len(ids)
                else:
                    block = ids.get(key)
                    if block is None or block in freed:
                        raise NotRepeating(f"a free does not match one allocation (event {start}+, block {t})")
                    freed.add(block)
                # remembered: the rebuild names the same modules L times over
                moved_names = here if moved is None else names.setdefault(moved, {})
                module = moved_names.get(e.module)
                if module is None:
                    module = moved_names[e.module] = _moved(e.module, prefix, name_shift if moved is None else moved)
                out.append((e.action, block, e.nbytes, e.category, e.phase, module, e.op, e.stream))
    if steady is None:
        steady = len(out)
    return out, steady, made


def _across(chunks: list[tuple[int | None, int, int]], events: list[MemEvent], block_layer: dict,
            role: dict[int, int]) -> tuple[dict[int, int], set[int]]:
    """What the middle block frees of its neighbours' storages that is not the same storage of every block's
    neighbour, in each run over the blocks: (roles, indices of events).

    Roles: of the first or the last block's storages that the middle block frees where a middle block's storage of
    another role is what the next block of the run frees in their place: the k-th storage of the block before it
    (the first, running up; the last, running down) that the middle block frees pairs with the k-th of the middle
    block's that the next block frees. A gradient summed over the blocks (the encoder's output that every decoder
    block reads) is the last block's first sum and every other block's second.

    Events: frees of the next block's storages (the first's, running down; the last's, up) that the block before
    does not free of the middle block's: a storage the first block makes and every block holds (T5's position bias,
    saved by every checkpointed block), freed once by the last holder. The 4-block check proves both."""
    last = TRACED - 1
    pairs: dict[int, int] = {}
    pinned: set[int] = set()

    def frees(chunk, owner):
        _, start, end = chunk
        return [(i, role[events[i].block]) for i in range(start, end)
                if events[i].action == "free" and block_layer.get(events[i].block) == owner]

    for c in range(1, len(chunks) - 1):
        before, t, after = chunks[c - 1][0], chunks[c][0], chunks[c + 1][0]
        if t != 1 or after not in (0, last):
            continue
        first, end = (last, 0) if after == 0 else (0, last)  # running down: the last block first; up: the first
        got, instead = frees(chunks[c], first), frees(chunks[c + 1], 1)
        if len(got) == len(instead):
            pairs.update((a, b) for (_, a), (_, b) in zip(got, instead) if a != b)
        if before == first:
            alike = [r for _, r in frees(chunks[c - 1], 1)]
            for i, r in frees(chunks[c], end):
                if r in alike:
                    alike.remove(r)
                else:
                    pinned.add(i)
    return pairs, pinned


def _chunks(events: list[MemEvent], tags: list[int | None]) -> list[tuple[int | None, int, int]]:
    """Runs of consecutive events of one block and phase: (block or None, first event, end). Frees alone
    that a run over the blocks makes late join the run they happen in: between two runs of one block (a
    loop over parameters freeing the previous one's temporary), or right after the run of the next block
    in the run's direction (a model's loop dropping the previous block's output once the next one
    returns) — unless they turn the run back (a list freed last to first). A block's events that come
    back after its neighbour's run began, with the neighbour going on after them, join the neighbour's
    run (a block's backward tail interleaved with the recompute of the block before it). Frees of storages of no
    block between two blocks' runs join the run before them."""
    def runs(tags):  # a run ends where its block or the phase changes (the optimizer's frees, then zero_grad's)
        found: list[tuple[int | None, int, int]] = []
        for i, t in enumerate(tags):
            if found and found[-1][0] == t and events[i].phase == events[i - 1].phase:
                found[-1] = (t, found[-1][1], i + 1)
            else:
                found.append((t, i, i + 1))
        return found

    chunks = runs(tags)
    out: list[tuple[int | None, int, int]] = []
    for c, (t, start, end) in enumerate(chunks):
        b = chunks[c + 1][0] if c + 1 < len(chunks) else None
        if t is None and b is not None and out and out[-1][0] is not None \
                and all(e.action == "free" for e in events[start:end]):
            # storages of no block freed between two blocks' runs join the run before them (BART's embeddings'
            # output, once the first encoder block's returns)
            out[-1] = (out[-1][0], out[-1][1], end)
            continue
        if (len(out) >= 2 and t is not None and out[-2][0] == t and out[-1][0] is not None
                and abs(out[-1][0] - t) == 1 and b == out[-1][0]):
            # the run had moved on from block t to its neighbour and goes on there: t's tail interleaved with
            # the neighbour's run (checkpointing: autograd reaches a block's recomputation before the rest of
            # the later block's backward, e.g. its adapters' weight gradients)
            out[-1] = (out[-1][0], out[-1][1], end)
            continue
        if out and t is not None and all(e.action == "free" for e in events[start:end]):
            a = out[-1][0]
            p = out[-2][0] if len(out) >= 2 else None
            # a, t, b one run turning back (a list freed last to first, right after its last block's run)
            reversed_run = a is not None and b is not None and b - t == t - a
            # p, a, t then a, b2: a sweep over the blocks that reaches the first or last block and comes back
            # (a model's per-block list freed last to first, then another first to last: GPT-NeoX's KV cache,
            # then autocast's cached casts, when the forward's outputs die)
            after = chunks[c + 2][0] if c + 2 < len(chunks) else None
            turning = (a is not None and p is not None and after is not None and a == b and abs(t - a) == 1
                       and p - a == a - t and after - b == b - t)
            if a is not None and not reversed_run and not turning and (
                    a == b or (p is not None and p - a == t - a and abs(t - a) == 1)):
                out[-1] = (a, out[-1][1], end)
                continue
        if out and out[-1][0] == t:
            out[-1] = (t, out[-1][1], end)
        else:
            out.append((t, start, end))
    return out


def canonical(trace: MemoryTrace) -> tuple[int, list[tuple]]:
    """The events with blocks numbered in order of first appearance: equal for equal steps."""
    return _canonical_rows(event_rows(trace.events), trace.steady_start)


def _canonical_rows(rows, steady: int) -> tuple[int, list[tuple]]:
    """`canonical` of the trace whose events are `rows` (event_rows; `_rebuilt_rows` gives them without
    making events)."""
    ids: dict[int, int] = {}
    return steady, [(r[0], ids.setdefault(r[1], len(ids)), *r[2:]) for r in rows]


# -- the estimate's entry ------------------------------------------------------------------------------


def _named(units: Units) -> str:
    return "blocks" if units == ONE else "units"


def units_of(wl) -> Units:
    """The units `wl`'s model config's blocks repeat in (`block_units`; a block each where there are none)."""
    cfg = wl.hf_config
    found = block_units(cfg, wl.task, num_layers_of(cfg))
    return found if isinstance(found, Units) else ONE


def small_trace(wl, blocks: int, batch_size: int, config: StepConfig, target: str, shaped=None) -> MemoryTrace:
    """The step of `wl`'s model config built with its first `blocks` units (`units_of`: a block each where its
    blocks are alike) (`shaped`: its training modes applied), traced as the rebuild traces it: events tagged by
    unit, no fallback, the warm-up a CUDA target's."""
    from .trace import trace_step

    units = units_of(wl)
    small = with_layers(wl, units.blocks(blocks))
    if shaped is not None:
        small = shaped(small)
    warmup = "copy" if target == "cuda" else "optimizer"
    return trace_step(small, batch_size, config, target, fallback=False, warmup=warmup,
                      layers=units.blocks(blocks), units=units)


def repeated_trace(wl, batch_size: int, config: StepConfig, target: str,
                   progress=None, shaped=None, traced: dict | None = None,
                   residual: BlockResidual | None = None) -> tuple[MemoryTrace | None, str]:
    """The step of `wl` (a model config with L blocks) rebuilt from 3- and 4-block traces, or (None, why).
    `shaped`: what makes the small models' workloads into the traced one (the training modes: LoRA,
    QLoRA, accumulation are applied to each small model as to the full one). `traced`, when given, gets
    the small traces run, by block count (a caller that cannot trace whole extrapolates from them); the
    ones it holds already (`small_trace`'s, run elsewhere, e.g. side by side in forks) are not traced again.
    `residual`: the same step's `BlockResidual` from a check at another micro-batch; the 4-block trace is then
    not run (unless `traced` holds it). The rebuilt trace carries its `block_residual` (None: not reusable)."""
    cfg = getattr(wl, "hf_config", None)
    layers = num_layers_of(cfg) if cfg is not None else None
    if layers is None or layers < MIN_LAYERS:
        return None, ""  # not a model config, or too shallow to gain: nothing to say
    if progress is not None:
        progress(f"comparing the {layers} blocks (built on the meta device)")
    units = block_units(cfg, wl.task, layers)
    if not isinstance(units, Units):
        return None, units
    blocks = layers  # the rebuild counts units (a block each where the blocks are alike)
    layers = units.unit_of(blocks - 1) + 1
    of = f"{layers} blocks" if units == ONE else \
        f"{layers} units of {blocks} blocks (unit 0: blocks 0..{units.first - 1}, then {units.period} blocks a unit)"
    traces = traced if traced is not None else {}
    for n in (TRACED, CHECKED):
        if n in traces:
            continue
        if n == CHECKED and residual is not None and getattr(traces[TRACED], "middle_costs", None) is not None:
            break  # checked at another micro-batch
        if progress is not None:
            progress(f"tracing {n} of {of} at batch {batch_size}")
        try:
            traces[n] = small_trace(wl, n, batch_size, config, target, shaped)
        except Exception as exc:  # noqa: BLE001 - whatever the fake trace cannot do, the whole trace handles
            traces.clear()
            return None, f"the {n}-{_named(units)[:-1]} trace failed ({type(exc).__name__})"
    three = traces[TRACED]
    try:
        if CHECKED in traces:
            rows, steady, _ = _rebuilt_rows(three, CHECKED)
            if _canonical_rows(rows, steady) != canonical(traces[CHECKED]):
                return None, (f"the {CHECKED}-{_named(units)[:-1]} trace differs from its rebuild from {TRACED} "
                              f"{_named(units)}")
        if progress is not None:
            progress(f"rebuilding {of}")
        full = rebuild(three, layers)
    except NotRepeating as exc:
        return None, str(exc)
    if CHECKED in traces:
        four = traces[CHECKED]
        f4, c4 = four.flops_per_step, four.op_costs
        full.block_residual = block_residual(three, four, batch_size)
        full.notes.append(f"repeated blocks: traced with {TRACED} and {CHECKED} of {of}; the events of "
                          f"{_named(units)} 1..{layers - 2} are the middle {_named(units)[:-1]}'s (exact: the "
                          f"{CHECKED}-{_named(units)[:-1]} trace matched its rebuild event for event)")
    else:  # one more block: the middle block's ops and the residual the check at another micro-batch measured
        f4 = three.flops_per_step + three.middle_flops + residual.flops
        c4 = None if three.op_costs is None else three.op_costs.added(three.middle_costs).added(residual.costs)
        full.block_residual = residual
        full.notes.append(f"repeated blocks: traced with {TRACED} of {of}; the events of {_named(units)} "
                          f"1..{layers - 2} are the middle {_named(units)[:-1]}'s (exact: the same step's "
                          f"{CHECKED}-{_named(units)[:-1]} trace matched its rebuild at micro-batch {residual.micro_batch})")
    f3 = three.flops_per_step
    full.flops_per_step = f3 + (layers - TRACED) * (f4 - f3)
    c3 = three.op_costs
    if c3 is not None and c4 is not None:
        full.op_costs = c3.combine(c4, layers - TRACED)
    return full, ""
