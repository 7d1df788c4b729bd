"""A real CUDA memory snapshot, turned into the plan's event shape for event-by-event comparison.

`torch.cuda.memory._record_memory_history()` makes the caching allocator log every action; its
`_snapshot()` returns `{"segments": [...], "device_traces": [[TraceEntry, ...] per device]}`, where a
TraceEntry is `{"action": "alloc" | "free_requested" | "free_completed" | "segment_alloc" |
"segment_free" | "oom" | "snapshot", "addr": int, "size": int, "stream": int, "frames": [{"filename",
"line", "name"}, ...]}` (documented in torch/cuda/memory.py `_snapshot`). Sizes of alloc/free entries
are the sizes asked of the allocator, before rounding: the same as `MemEvent.nbytes`.

While recording, `PhaseMarks` notes where each phase of the step begins in the trace (hooks on the
model, its backward and the optimizer), because the autograd engine runs backward on its own thread
with no Python frames to tell it apart. The saved snapshot carries them under the key "gpuwise".
"""

from __future__ import annotations

import difflib
import pickle
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..plan.memory.events import MemEvent, MemoryTrace, live_peak

ALLOC, FREES = "alloc", ("free_requested", "free")  # "free" in torch < 2.1 traces


# ---- child side: phase marks while recording ---------------------------------------------------

class PhaseMarks:
    """Record the trace length where forward, backward, optimizer and zero_grad begin in each step.

    Forward: the workload's loss function is entered (the batch copy comes just before it);
    backward: the loss's gradient hook fires (first thing in backward); optimizer / zero_grad: the
    optimizer's step pre / post hooks. Nothing here allocates device memory.
    """

    def __init__(self, step, device_index: int):
        import dataclasses

        self.device_index = device_index
        self.marks: list[tuple[int, str]] = []
        workload = dataclasses.replace(step.workload)
        original = step.workload.compute_loss

        def compute_loss(model, batch):
            self.mark("forward")
            loss = original(model, batch)
            if loss.requires_grad:
                loss.register_hook(self._backward_hook)
            return loss

        workload.compute_loss = compute_loss  # instance attribute: only this step's copy is wrapped
        self._step, self._original = step, step.workload
        step.workload = workload
        self._handles = [
            step.optimizer.register_step_pre_hook(lambda *_: self.mark("optimizer")),
            step.optimizer.register_step_post_hook(lambda *_: self.mark("zero_grad")),
        ]

    def _backward_hook(self, grad):
        self.mark("backward")

    def trace_length(self) -> int:
        import torch

        traces = torch.cuda.memory._snapshot()["device_traces"]
        return len(traces[self.device_index]) if self.device_index < len(traces) else 0

    def mark(self, phase: str) -> None:
        if not self.marks or self.marks[-1][1] != phase:
            self.marks.append((self.trace_length(), phase))

    def remove(self) -> None:
        """Unhook: the step runs as before (its own workload back, the optimizer hooks gone)."""
        for h in self._handles:
            h.remove()
        self._step.workload = self._original


def save(path: str, device_index: int, steady_start: int | None, marks: list[tuple[int, str]]) -> None:
    """Pickle the snapshot (torch's `_dump_snapshot` format, viewable at pytorch.org/memory_viz)."""
    import torch

    snap = torch.cuda.memory._snapshot()
    snap["gpuwise"] = {"device": device_index, "steady_start": steady_start, "phase_marks": marks}
    with open(path, "wb") as f:
        pickle.dump(snap, f)


def load(path: str) -> dict[str, Any]:
    with open(path, "rb") as f:
        return pickle.load(f)


# ---- conversion ----------------------------------------------------------------------------------

def _phase_from_frames(frames: list[dict]) -> str | None:
    """A phase from Python frames when there are no marks (innermost frame first)."""
    names = [(f.get("filename", ""), f.get("name", "")) for f in frames or []]
    for filename, name in names:
        if "zero_grad" in name:
            return "zero_grad"
        if "torch/optim/" in filename.replace("\\", "/"):
            return "optimizer"
        if "backward" in name or "autograd" in filename:
            return "backward"
    for filename, name in names:
        if name in ("_apply", "to", "cuda") and "torch/nn/modules/module.py" in filename.replace("\\", "/"):
            return "setup"
    return None


def _op_from_frames(frames: list[dict]) -> str:
    """The innermost frame outside torch itself, as `name (file:line)`: where the user's code asked."""
    for f in frames or []:
        filename = f.get("filename", "").replace("\\", "/")
        if "/torch/" not in filename and not filename.startswith("??"):
            return f"{f.get('name', '?')} ({filename.rsplit('/', 1)[-1]}:{f.get('line', 0)})"
    return frames[0].get("name", "") if frames else ""


def _categorise(alloc_phase: str, freed_in: str | None) -> str:
    """A category from when a block was born and died (the snapshot carries no tensor roles).

    parameters: born in setup and never freed; optimizer_state: born in the optimizer, never freed;
    gradients: born in backward and freed by zero_grad (or alive at the end); inputs: copied in before
    the forward of a step; activations: born in forward and freed in backward;
    everything else: temporary.
    """
    if alloc_phase == "setup":
        return "parameters" if freed_in is None else "temporary"
    if alloc_phase == "optimizer":
        return "optimizer_state" if freed_in is None else "temporary"
    if alloc_phase == "backward":
        return "gradients" if freed_in in (None, "zero_grad") else "temporary"
    if alloc_phase == "forward":
        return "activations" if freed_in in ("backward", "optimizer", "zero_grad") else "temporary"
    if alloc_phase == "inputs":
        return "inputs"
    return "temporary"


def _phase_at(marks: list[tuple[int, str]], index: int, default: str) -> str:
    phase = default
    for at, name in marks:
        if at > index:
            break
        phase = name
    return phase


def to_trace(snapshot: dict[str, Any], device: int | None = None) -> MemoryTrace:
    """Convert a snapshot dict into a `MemoryTrace` of alloc/free `MemEvent`s.

    Blocks are numbered per allocation (addresses are reused). A free of a block allocated before
    recording started becomes an alloc at the start of the trace, so live totals are absolute.
    """
    meta = snapshot.get("gpuwise", {})
    dev = device if device is not None else meta.get("device", 0) or 0
    traces = snapshot.get("device_traces") or []
    entries = traces[dev] if dev < len(traces) else []
    marks = [tuple(m) for m in meta.get("phase_marks") or []]
    steady_entry = meta.get("steady_start")
    notes: list[str] = []

    # first pass: block ids, birth/death phases
    live: dict[int, int] = {}            # addr -> block id
    births: dict[int, tuple[int, str]] = {}  # block -> (entry index, phase)
    deaths: dict[int, str] = {}
    pre_existing: list[tuple[int, int, int]] = []  # (block, size, stream)
    rows: list[tuple[int, str, int, int, str, str, int]] = []  # (entry i, action, block, size, phase, op, stream)
    next_block = 0
    for i, e in enumerate(entries):
        action = e.get("action")
        if action not in (ALLOC, *FREES):
            continue
        frames = e.get("frames") or []
        phase = _phase_at(marks, i, "setup") if marks else (_phase_from_frames(frames) or "forward")
        if action == ALLOC:
            block = next_block
            next_block += 1
            live[e["addr"]] = block
            if phase == "zero_grad":  # allocated between a step's end and the next forward: the batch copy
                births[block], phase = (i, "inputs"), "forward"
            else:
                births[block] = (i, phase)
        else:
            block = live.pop(e["addr"], None)
            if block is None:
                block = next_block
                next_block += 1
                pre_existing.append((block, int(e.get("size", 0)), int(e.get("stream", 0))))
                births[block] = (-1, "setup")
            deaths[block] = phase
        rows.append((i, "alloc" if action == ALLOC else "free", block, int(e.get("size", 0)), phase,
                     _op_from_frames(frames), int(e.get("stream", 0))))
    if pre_existing:
        notes.append(f"{len(pre_existing)} block(s) allocated before recording started")

    def category(block: int) -> str:
        return _categorise(births[block][1], deaths.get(block))

    events = [MemEvent("alloc", b, size, category(b), "setup", "", "(before recording)", stream)
              for b, size, stream in pre_existing]
    steady_start = None
    for i, action, block, size, phase, op, stream in rows:
        if steady_start is None and steady_entry is not None and i >= steady_entry:
            steady_start = len(events)
        events.append(MemEvent(action, block, size, category(block), phase if phase in _PHASES else "forward",
                               "", op, stream))
    if steady_start is None:
        steady_start = 0 if steady_entry is None else len(events)
        if steady_entry is None:
            notes.append("no steady-state mark in the snapshot: the whole trace counts as steady")
    # the driver's segment addresses, for a replay that must make the real allocator's choices; unknown for
    # the segments of blocks allocated before recording started
    segments = () if pre_existing else tuple(e["addr"] for e in entries if e.get("action") == "segment_alloc")
    return MemoryTrace(events, steady_start, "cuda", method="cuda-snapshot", notes=notes,
                       segment_addresses=segments)


_PHASES = ("setup", "forward", "backward", "optimizer", "zero_grad")


@dataclass(frozen=True)
class TraceComparison:
    """Event-by-event comparison of a predicted and a measured trace's steady step."""

    predicted_peak_bytes: int
    measured_peak_bytes: int
    predicted_allocs: int
    measured_allocs: int
    matched_allocs: int                       # allocations paired in order with the same size
    by_phase_bytes: dict[str, tuple[int, int]]  # phase -> (predicted, measured) bytes allocated

    @property
    def peak_error(self) -> float:
        return (self.predicted_peak_bytes - self.measured_peak_bytes) / max(self.measured_peak_bytes, 1)


def compare(predicted: MemoryTrace, measured: MemoryTrace) -> TraceComparison:
    """Pair the steady-step allocations of two traces in order (by size) and compare peaks and phases."""
    def allocs(t: MemoryTrace) -> list[MemEvent]:
        return [e for e in t.events[t.steady_start:] if e.action == "alloc"]

    pa, ma = allocs(predicted), allocs(measured)
    matcher = difflib.SequenceMatcher(a=[e.nbytes for e in pa], b=[e.nbytes for e in ma], autojunk=False)
    matched = sum(block.size for block in matcher.get_matching_blocks())
    pp, mp = Counter(), Counter()
    for e in pa:
        pp[e.phase] += e.nbytes
    for e in ma:
        mp[e.phase] += e.nbytes
    phases = {p: (pp.get(p, 0), mp.get(p, 0)) for p in _PHASES if pp.get(p) or mp.get(p)}
    return TraceComparison(live_peak(predicted).allocated_bytes, live_peak(measured).allocated_bytes,
                           len(pa), len(ma), matched, phases)
