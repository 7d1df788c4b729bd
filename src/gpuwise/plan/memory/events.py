"""The plan's internal interface: a training step as a list of memory events.

The tracer writes it; the allocator simulator, the breakdowns and the charts read it; a real CUDA
memory snapshot (`torch.cuda.memory._record_memory_history`) is converted into the same shape so the
two can be compared event by event.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ...errors import GpuwiseError

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporary", "buffers", "inputs")
PHASES = ("setup", "forward", "backward", "optimizer", "zero_grad")
TARGETS = ("cuda", "cpu")  # the devices a trace's tensors stand for (MemoryTrace.device_type)


def check_target(target: str) -> str:
    if target not in TARGETS:
        raise GpuwiseError(f"unknown target {target!r}; choose from: {', '.join(TARGETS)}")
    return target


@dataclass(frozen=True, slots=True)
class MemEvent:
    action: str      # "alloc" | "free"
    block: int       # identity of the storage: unique over the trace, shared by its alloc and its free
    nbytes: int      # bytes asked of the allocator (storage size, before the allocator's rounding)
    category: str    # one of CATEGORIES
    phase: str       # one of PHASES
    module: str = ""  # dotted path of the innermost module running when it happened ("" outside modules)
    op: str = ""      # the aten op (or "kernel workspace: <op>") that caused it
    stream: int = 0


def event_rows(events):
    """Each event's fields in order, as a row (the inverse of `events_from_rows`)."""
    return ((e.action, e.block, e.nbytes, e.category, e.phase, e.module, e.op, e.stream) for e in events)


def events_from_rows(rows) -> list[MemEvent]:
    """MemEvents from rows of their fields in order (action, block, nbytes, category, phase, module, op,
    stream): the same objects as `MemEvent(*row)`, about twice as fast (the slots are set directly rather
    than through the frozen dataclass's `object.__setattr__` calls) for the ~10^5 events of a deep model."""
    new = object.__new__
    a, b, n, c, p, m, o, s = (MemEvent.__dict__[f].__set__ for f in MemEvent.__slots__)
    out = []
    append = out.append
    for action, block, nbytes, category, phase, module, op, stream in rows:
        e = new(MemEvent)
        a(e, action)
        b(e, block)
        n(e, nbytes)
        c(e, category)
        p(e, phase)
        m(e, module)
        o(e, op)
        s(e, stream)
        append(e)
    return out


@dataclass
class MemoryTrace:
    """Events from building the model through warm-up step(s) to the steady-state step.

    `events[steady_start:]` is the steady-state step (optimizer state already alive); everything before
    it is setup and warm-up, replayed so that an allocator simulation sees the same history as a process.
    The construction is traced as the tensors stand for the target's; the CUDA replay sees the model built
    on the host and moved (`built_on_the_host`), as gpuwise's runner builds it.
    """

    events: list[MemEvent]
    steady_start: int
    device_type: str          # "cuda" | "cpu"
    method: str = "fake-trace"
    notes: list[str] = field(default_factory=list)
    flops_per_step: int = 0   # FLOPs of the steady-state step (torch.utils.flop_counter formulas)
    layers: Any = field(default=None, repr=False)  # plan/tracing/repeat_tags.py's EventLayers, when blocks were followed
    op_costs: Any = field(default=None, repr=False)  # plan/speed/ops.py's OpCosts of the steady step (fake traces)
    # a measured trace's cudaMalloc addresses, in order (plan/memory/allocator.py takes them; () = laid out in order)
    segment_addresses: tuple[int, ...] = field(default=(), repr=False)

    # pickled (a forked trace sent back to fit's process) column by column: one tuple per field instead of an
    # object per event, several times faster to load for the ~10^5 events of a rebuilt deep model
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["events"] = tuple(zip(*event_rows(self.events)))
        return state

    def __setstate__(self, state: dict) -> None:
        state["events"] = events_from_rows(zip(*state["events"])) if state["events"] else []
        self.__dict__.update(state)


def built_on_the_host(trace: MemoryTrace) -> MemoryTrace:
    """`trace` as the device sees a model built on the host and then moved (gpuwise's runner builds the
    workload's model on the CPU, casts it and moves it; `from_pretrained` loads into the storage dtype): the
    setup before the first input arrives keeps only what is still live then, in its order. The construction's
    scratch and the copies a cast replaces (a bf16-pure model's fp32 weights, 4-bit layers' float weights)
    never reach the device. `trace` itself when the setup frees nothing, or when it was measured on a device
    (a CUDA snapshot is what the device saw)."""
    if trace.segment_addresses or trace.method == "cuda-snapshot":
        return trace
    events = trace.events
    end = next((i for i, ev in enumerate(events) if ev.phase != "setup" or ev.category == "inputs"), len(events))
    end = min(end, trace.steady_start)
    gone = {ev.block for ev in events[:end] if ev.action == "free"}
    if not gone:
        return trace
    kept = [ev for ev in events[:end] if ev.block not in gone]
    return dataclasses.replace(trace, events=kept + events[end:], steady_start=trace.steady_start - (end - len(kept)))


@dataclass(frozen=True)
class Peak:
    """The highest total of live bytes in the steady-state step, and what was live then."""

    allocated_bytes: int
    event_index: int
    phase: str
    op: str
    module: str
    by_category: dict[str, int]
    by_module: dict[str, int]


def live_peak(trace: MemoryTrace, round_to: int = 1) -> Peak:
    """Replay the events and find the steady-state peak of live bytes (each size rounded up to `round_to`)."""
    events, steady = trace.events, trace.steady_start
    live: set[int] = set()
    total = 0
    best_total, best_i = -1, steady
    # one pass; peaks are looked for from the steady step on (a free counts its own size, as the allocator's)
    for i, ev in enumerate(events):
        size = ev.nbytes if round_to == 1 else -(-ev.nbytes // round_to) * round_to
        if ev.action == "alloc":
            live.add(ev.block)
            total += size
        elif ev.block in live:
            live.discard(ev.block)
            total -= size
        if total > best_total and i >= steady:
            best_total, best_i = total, i
    # second pass to the peak, for the breakdown of what was live there
    alive: dict[int, MemEvent] = {}
    for ev in events[: best_i + 1]:
        if ev.action == "alloc":
            alive[ev.block] = ev
        else:
            alive.pop(ev.block, None)
    by_cat: Counter[str] = Counter({c: 0 for c in CATEGORIES})
    by_mod: Counter[str] = Counter()
    for ev in alive.values():
        size = -(-ev.nbytes // round_to) * round_to
        by_cat[ev.category] += size
        by_mod[ev.module.split(".")[0] if ev.module else "(outside modules)"] += size
    at = events[best_i] if events else MemEvent("alloc", 0, 0, "temporary", "setup")
    return Peak(max(best_total, 0), best_i, at.phase, at.op, at.module, dict(by_cat), dict(by_mod.most_common()))
