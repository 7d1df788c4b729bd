"""One rank's numbers at one micro-batch size (`Point`), as plan/scaled.py's `Evaluator` replays them from a
trace, and the per-phase peaks of a trace (`phase_peaks`) they hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .memory.events import CATEGORIES, MemoryTrace


@dataclass
class Point:
    """One rank's step at one micro-batch size, on one GPU architecture."""

    device_used_bytes: int
    peak_allocated_bytes: int
    by_category: dict[str, int] = field(default_factory=dict)
    flops_per_step: int = 0
    trainable_bytes: int = 0        # gradients produced per micro-step (one per trainable parameter)
    block_param_bytes: int = 0      # parameters of one repeated block (the FSDP unit)
    notes: list[str] = field(default_factory=list)
    phases: dict[str, tuple[int, dict[str, int]]] = field(default_factory=dict)  # phase -> (peak, categories)
    activations_bytes: int = 0      # most saved activations live at once
    batch_norm: bool = False        # the step runs batch norm (accumulation changes its statistics)
    op_costs: Any = None            # plan/speed/ops.py OpCosts of the step (the speed model's input)
    extrapolated: bool = False      # linear in the blocks from two small traces (the labelled fallback)
    trainable_tensors: int = 0      # gradient tensors per micro-step (one per trainable parameter)
    # not a field (not compared, not in asdict): the Evaluator's key of the replay behind it, None where the
    # numbers are not one replay's (an extrapolation, a pipeline stage)
    replayed_from = None
    # not a field either: that replay's allocator result with room (plan/memory/cuda.py), which the replay under a
    # card's limit (`Evaluator.under_limit`) starts from instead of replaying it again
    free_replay = None

    def extrapolate(self, two: Point, layers: int, at: tuple[int, int] = (1, 2)) -> Point:
        """The step at `layers` from this point and `two`, traced with `at` = (a, a + 1) layers. Each
        phase's peak is linear in the layers, but which phase peaks can change with depth (a max of
        lines): every phase is extrapolated and the highest taken. The allocator's and context's bytes
        above the live peak (cached free blocks, which accumulate per layer) are extrapolated the same way."""
        w = (layers - at[0]) / (at[1] - at[0])

        def lin(a: int, b: int) -> int:
            return max(int(round(a + (b - a) * w)), 0)

        best: tuple[int, dict[str, int]] = (0, {})
        for phase, (b2, c2) in two.phases.items():
            b1, c1 = self.phases.get(phase, (b2, c2))
            total = lin(b1, b2)
            if total > best[0]:
                best = (total, {c: lin(c1.get(c, 0), c2.get(c, 0)) for c in CATEGORIES})
        above = lin(self.device_used_bytes - self.peak_allocated_bytes, two.device_used_bytes - two.peak_allocated_bytes)
        costs = (self.op_costs.combine(two.op_costs, w)
                 if self.op_costs is not None and two.op_costs is not None else None)
        return Point(best[0] + above, best[0], best[1], lin(self.flops_per_step, two.flops_per_step),
                     lin(self.trainable_bytes, two.trainable_bytes), two.block_param_bytes, list(two.notes),
                     {}, lin(self.activations_bytes, two.activations_bytes), self.batch_norm or two.batch_norm, costs,
                     extrapolated=True, trainable_tensors=lin(self.trainable_tensors, two.trainable_tensors))


def phase_peaks(trace: MemoryTrace, round_to: int = 512) -> tuple[dict[str, tuple[int, dict[str, int]]], int]:
    """Per phase of the steady step: the highest live bytes (sizes rounded as the allocator does) and
    the categories live then; and the most activation bytes live at once."""
    live: dict[int, tuple[int, int]] = {}  # block -> (size, category's index)
    total = 0
    names = list(CATEGORIES)  # the categories in order of first appearance after CATEGORIES: by_cat's keys
    index = {c: i for i, c in enumerate(names)}
    by_cat = [0] * len(names)
    best: dict[str, int] = {}
    peaks: dict[str, tuple[int, list[int]]] = {}  # phase -> (peak, by_cat then)
    acts = 0
    activations = index["activations"]
    steady = trace.steady_start
    for i, e in enumerate(trace.events):
        size = -(-e.nbytes // round_to) * round_to
        if e.action == "alloc":
            c = index.get(e.category)
            if c is None:
                c = index[e.category] = len(names)
                names.append(e.category)
                by_cat.append(0)
            live[e.block] = (size, c)
            total += size
            by_cat[c] += size
        elif e.block in live:
            size, c = live.pop(e.block)
            total -= size
            by_cat[c] -= size
        if i >= steady:
            if total > best.get(e.phase, -1):
                best[e.phase] = total
                peaks[e.phase] = (total, by_cat[:])
            if by_cat[activations] > acts:
                acts = by_cat[activations]
    return {phase: (peak, dict(zip(names, cats))) for phase, (peak, cats) in peaks.items()}, acts
