"""Fast numbers for deep models: trace 1 and 2 layers, extrapolate to L (and evaluate many variants).

A decoder's step is its embeddings and head plus L identical blocks: every byte count of the step
(parameters, gradients, state, activations, the caching allocator's segments) and its FLOPs grow
linearly in L, so two traces of the model built from its config with 1 and 2 layers give the L-layer
numbers as  x(L) = x(1) + (x(2) - x(1)) * (L - 1). The traces are small (fake tensors, a second each),
so `fit` can evaluate dozens of variants of a 7B or 70B model in seconds. Checked against full-depth
traces in tests/test_plan_fit.py. A workload that is not a model config is traced whole.

`Evaluator` caches traces by (layers, micro-batch, step config, modes): sharding and offload are
transforms of a trace (plan/memory/sharding.py, plan/tracing/modes.py) and cost no new trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..hf import num_layers_of
from ..step import StepConfig
from ..workload import load_workload
from .memory.cuda import cuda_memory
from .memory.events import CATEGORIES, MemoryTrace, live_peak
from .memory.sharding import Split, block_param_bytes, fsdp_units_of, rank_trace, trainable_bytes
from .tracer import trace_workload
from .tracing.modes import TrainingModes, offload_optimizer_state


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

    def extrapolate(self, two: Point, layers: int) -> Point:
        """The step at `layers` from this 1-layer point and a 2-layer one. Each phase's peak is linear
        in the layers, but which phase peaks can change with depth (a max of lines): every phase is
        extrapolated and the highest taken. The allocator's and context's bytes above the live peak
        (cached free blocks, which accumulate per layer) are extrapolated the same way."""
        w = layers - 1

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
                     {}, lin(self.activations_bytes, two.activations_bytes), self.batch_norm or two.batch_norm, costs)


def phase_peaks(trace: MemoryTrace, round_to: int = 512) -> tuple[dict[str, tuple[int, dict[str, int]]], int]:
    """Per phase of the steady step: the highest live bytes (sizes rounded as the allocator does) and
    the categories live then; and the most activation bytes live at once."""
    live: dict[int, tuple[int, str]] = {}
    total = 0
    by_cat = dict.fromkeys(CATEGORIES, 0)
    peaks: dict[str, tuple[int, dict[str, int]]] = {}
    acts = 0
    for i, e in enumerate(trace.events):
        size = -(-e.nbytes // round_to) * round_to
        if e.action == "alloc":
            live[e.block] = (size, e.category)
            total += size
            by_cat[e.category] = by_cat.get(e.category, 0) + size
        elif e.block in live:
            size, cat = live.pop(e.block)
            total -= size
            by_cat[cat] -= size
        if i >= trace.steady_start:
            if total > peaks.get(e.phase, (-1, {}))[0]:
                peaks[e.phase] = (total, dict(by_cat))
            acts = max(acts, by_cat.get("activations", 0))
    return peaks, acts


class Evaluator:
    """Traces a workload (or a model config at 1 and 2 layers) once per variant; evaluates any split."""

    def __init__(self, workload, arch: str):
        self.wl = load_workload(workload)
        self.arch = arch
        cfg = getattr(self.wl, "hf_config", None)
        self.layers = num_layers_of(cfg) if cfg is not None else None
        if self.layers is not None and self.layers <= 2:
            self.layers = None  # nothing to gain
        self._traces: dict[tuple, MemoryTrace] = {}
        self._fsdp_units: tuple | None = None
        self.traces_run = 0

    def units(self, split: Split):
        """FSDP2's root and block shares of the whole model (built once on meta, only for fsdp/hsdp)."""
        if split.strategy not in ("fsdp", "hsdp") or split.nproc < 2:
            return None
        if self._fsdp_units is None:
            self._fsdp_units = (fsdp_units_of(self.wl),)
        return self._fsdp_units[0]

    # -- traces -----------------------------------------------------------------------------------
    def trace(self, layers: int | None, micro_batch: int, config: StepConfig, modes: TrainingModes) -> MemoryTrace:
        from dataclasses import replace

        traced_modes = replace(modes, offload_optimizer=False)  # offload is a transform of the trace
        key = (layers, micro_batch, config.optimizer, config.precision, config.checkpointing, traced_modes)
        if key not in self._traces:
            self._traces[key] = trace_workload(self.wl, micro_batch, config, "cuda", modes=traced_modes, layers=layers)
            self.traces_run += 1
        return self._traces[key]

    # -- numbers ----------------------------------------------------------------------------------
    def _point(self, trace: MemoryTrace, modes: TrainingModes, split: Split, block_param_bytes: int,
               param_bytes: int | None = None) -> Point:
        costs = trace.op_costs
        if modes.offload_optimizer:
            trace = offload_optimizer_state(trace)
        trainable = trainable_bytes(trace)
        ranked = rank_trace(trace, split, block_param_bytes, self.units(split), param_bytes,
                            accumulating=modes.grad_accum > 1)
        cuda = cuda_memory(ranked, self.arch)
        peak = live_peak(ranked)
        phases, acts = phase_peaks(ranked)
        top = max((b for b, _ in phases.values()), default=0)
        # the replay's allocated peak can differ from the rounded live peak by the workspaces: keep both consistent
        return Point(cuda.device_used_bytes, max(top, 0), dict(peak.by_category), int(trace.flops_per_step), trainable,
                     block_param_bytes, list(ranked.notes), phases, acts,
                     any("batch_norm" in e.op for e in trace.events[trace.steady_start:]), costs)

    def evaluate(self, micro_batch: int, config: StepConfig, modes: TrainingModes, split: Split) -> Point:
        """One rank's numbers at `micro_batch` (FLOPs per optimizer step include the accumulation)."""
        if self.layers is None:
            point = self._point(self.trace(None, micro_batch, config, modes), modes, split,
                                block_param_bytes(self.trace(None, micro_batch, config, modes)))
        else:
            layers = self.layers
            if split.strategy == "pipeline":
                layers = math.ceil(self.layers / split.nproc)
            t1 = self.trace(1, micro_batch, config, modes)
            t2 = self.trace(2, micro_batch, config, modes)
            block = max(_param_bytes(t2) - _param_bytes(t1), 0)
            # the whole model's parameter bytes: one block is `units.block` of them
            units = self.units(split)
            whole = int(block / units.block) if units is not None and units.block else None
            point = self._point(t1, modes, split, block, whole).extrapolate(
                self._point(t2, modes, split, block, whole), layers)
            point.notes.append(f"numbers from traces with 1 and 2 of {self.layers} layers, extrapolated to {layers}")
            if split.strategy == "pipeline" and split.nproc > 1:
                extra = (split.nproc - 1) * point.activations_bytes
                point.device_used_bytes += extra
                point.peak_allocated_bytes += extra
                point.notes.append(f"pipeline: stage 0 of {split.nproc} holds {split.nproc} micro-batches' "
                                   "activations (1F1B); embeddings and head counted in the stage")
        if modes.grad_accum > 1:
            point.flops_per_step = point.flops_per_step * modes.grad_accum // modes.traced_micro_steps
            if point.op_costs is not None:
                point.op_costs = point.op_costs.scaled(modes.grad_accum / modes.traced_micro_steps)
        return point


def _param_bytes(trace: MemoryTrace) -> int:
    return live_peak(trace).by_category.get("parameters", 0)
