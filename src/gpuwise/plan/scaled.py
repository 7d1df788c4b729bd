"""`fit`'s numbers: each variant's step as `estimate` traces it, evaluated under any split.

A deep model config (L identical blocks) is traced as `estimate` traces it, through the tracer's one
entrance: rebuilt exactly from 3- and 4-block traces (plan/tracing/repeat.py), under the named GPU's
attention kernels, replayed through the same allocator model, so each option's bytes are what its
`estimate_cmd` prints (tests/test_plan_fit.py). A model the rebuild does not cover (its blocks differ,
or the 4-block trace differs from its rebuild, e.g. Adafactor) is not traced whole, which
costs L blocks: its numbers are extrapolated linearly in the blocks from the two small traces,
x(L) = x(a) + (x(b) - x(a)) * (L - a) / (b - a), and the option says so (a labelled fallback; estimate
traces it whole, and so does fit for the answer of a variant that fits: `evaluate(..., whole=True)`). A workload that is not a model config, or a config under 6 blocks, is traced whole.

Its traces may run side by side in forks of the process (`forks`, plan/forks.py's `ForkedTraces`, a mixin of
the same cache). `Evaluator` caches traces by (blocks, micro-batch, step config, traced modes, the GPU's attention kernel
class: GPUs whose capabilities pick the same SDPA kernels share traces): sharding
and offload are transforms of a trace (plan/memory/sharding.py, plan/tracing/modes.py) and cost no new
trace; accumulation over N micro-steps traces min(N, 2) of them whatever N is. A step asked at several
micro-batches runs its 4-block check at the first only (plan/tracing/repeat.py `BlockResidual`). A step under
another named optimizer is the same step traced with AdamW, its optimizer's steps swapped
(plan/tracing/optimizer_swap.py: checked event for event; traced itself where the check fails): 8-bit AdamW and
Adafactor cost no trace of their own, and Adafactor, whose 4-block check fails, is exact rather than extrapolated.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import replace
from typing import Any

from ..hf import TASKS, num_layers_of
from ..step import StepConfig
from ..workload import load_workload
from .forks import ForkedTraces, step_of, traces_in
from .memory.cuda import CudaMemory, cuda_memory
from .memory.events import MemoryTrace, Peak, live_peak
from .memory.fsdp_units import block_param_bytes, fsdp_units_of
from .memory.overheads import context_bytes, module_loading, replay_inputs
from .memory.sharding import rank_trace, trainable_bytes, trainable_tensors
from .memory.split import Split
from .point import Point, phase_peaks
from .tracer import (
    BASE_OPTIMIZER,
    NotRebuilt,
    swap_base,
    trace_blocks,
    trace_optimizer_steps,
    trace_workload,
    with_optimizer,
)
from .tracing.modes import TrainingModes, offload_optimizer_state
from .tracing.repeat import BlockResidual


class Evaluator(ForkedTraces):
    """Traces a workload once per variant, micro-batch and GPU capability, as `estimate` does; evaluates
    any split of it.

    A deep model config is rebuilt exactly from its 3- and 4-block traces (the tracer's `repeat`, the same
    way in as `estimate`'s, under the same GPU's attention kernels), so an option's bytes are what its
    `estimate_cmd` gives. Where the rebuild is not available (the notes say why) the numbers are
    extrapolated from the small traces instead (`Point.extrapolate`), and the option says so."""

    def __init__(self, workload, arch: str, capability: tuple[int, int] | None = None):
        self.wl = load_workload(workload)
        self.arch = arch
        self.capability = capability   # the GPU's compute capability: the attention kernels (estimate's)
        cfg = getattr(self.wl, "hf_config", None)
        self.layers = num_layers_of(cfg) if cfg is not None else None
        if self.layers is not None and self.layers <= 2:
            self.layers = None  # nothing to gain
        self._traces: dict[tuple, MemoryTrace | NotRebuilt] = {}
        self._fsdp_units: tuple | None = None
        self._points: dict[tuple, tuple[MemoryTrace, Point, str]] = {}  # ... -> (trace, point, replayed for arch)
        self._capped: dict[tuple, CudaMemory | None] = {}  # (a _points key, limit, arch) -> `under_limit`
        self._peaks: dict[int, tuple[MemoryTrace, Peak]] = {}  # id(trace) -> (trace, its live_peak)
        self.traces_run = 0
        self._param_count: int | None = None
        # a step (its key less the micro-batch) -> the BlockResidual of its 4-block check at one micro-batch: its
        # other micro-batches trace 3 blocks only (plan/tracing/repeat.py)
        self._checked: dict[tuple, BlockResidual] = {}
        # (blocks, step, modes) -> that optimizer's steps traced alone (`_with_optimizer`), whatever the micro-batch
        self._optimizer_steps: dict[tuple, Any] = {}
        self._no_swap: set[tuple] = set()  # steps (`_steps_key`) whose swap's check failed: traced themselves
        self.compile = False  # fit --compile: the options' speed as torch.compile runs them (the traces are the same)

    @contextlib.contextmanager
    def on_gpu(self, arch: str, capability: tuple[int, int] | None):
        """Inside: traces and replays are that GPU's (its architecture's workspaces and context, its compute
        capability's attention kernels); as before after."""
        was = self.arch, self.capability
        self.arch, self.capability = arch, capability
        try:
            yield self
        finally:
            self.arch, self.capability = was

    def units(self, split: Split):
        """FSDP2's root and block shares of the whole model (built once on meta, only for fsdp/hsdp)."""
        if split.strategy not in ("fsdp", "hsdp") or split.nproc < 2:
            return None
        if self._fsdp_units is None:
            self._fsdp_units = (fsdp_units_of(self.wl),)
        return self._fsdp_units[0]

    def parameter_count(self) -> int | None:
        """The model config's parameters (tied ones once), built on the meta device once; None for a
        workload that is not a model config."""
        if self._param_count is None and getattr(self.wl, "hf_config", None) is not None:
            import torch
            import transformers

            with torch.device("meta"):
                model = getattr(transformers, TASKS[self.wl.task]).from_config(self.wl.hf_config)
            self._param_count = sum(p.numel() for p in model.parameters())
        return self._param_count

    # -- traces -----------------------------------------------------------------------------------
    def _key(self, layers, micro_batch: int, config: StepConfig, modes: TrainingModes, repeat: bool) -> tuple:
        from .tracing.sdpa import kernel_class  # deferred: imports torch

        # offload is a transform of the trace; accumulation traces min(N, 2) micro-steps whatever N is
        traced = replace(modes, offload_optimizer=False, grad_accum=modes.traced_micro_steps)
        step = tuple(sorted(vars(config).items()))  # every field of the step, new ones included
        return (layers, micro_batch, step, traced, repeat, kernel_class(self.capability))

    def _run(self, key: tuple, config: StepConfig, forked: tuple[dict, dict] | None = None) -> MemoryTrace:
        """`key`'s step traced (`forked`: its two small traces, by block count, and their attention calls,
        already run in forks (plan/forks.py); the rebuild uses them)."""
        from .tracing.sdpa import AttentionTarget, using_target  # deferred: imports torch

        layers, micro_batch, _, traced, repeat, _ = key
        capability = self.capability or (9, 0)
        small, calls = forked or ({}, {})
        with using_target(AttentionTarget(capability)) as target:
            trace = trace_workload(self.wl, micro_batch, config, "cuda", repeat, modes=traced, layers=layers,
                                   whole=False, small=small, residual=self._checked.get(step_of(key)))
        self._remember(key, trace)
        # what `_shared` re-decides for another GPU: every attention call, in the order the traces ran
        trace.attention = (capability, sum((calls[n] for n in sorted(calls)), ()) + tuple(target.calls))
        return trace

    def _remember(self, key: tuple, trace: MemoryTrace) -> None:
        """A rebuilt step's residual, for its other micro-batches (the first micro-batch checked keeps it)."""
        residual = getattr(trace, "block_residual", None)
        if residual is not None:
            self._checked.setdefault(step_of(key), residual)

    def _blocks(self, key: tuple, blocks: int, config: StepConfig) -> tuple[MemoryTrace, tuple]:
        """One of the two small traces `key`'s rebuild needs (`blocks` blocks), as `_run` would trace it, and
        the attention calls it made (run in a fork: plan/forks.py)."""
        from .tracing.sdpa import AttentionTarget, using_target  # deferred: imports torch

        _, micro_batch, _, traced, _, _ = key
        with using_target(AttentionTarget(self.capability or (9, 0))) as target:
            trace = trace_blocks(self.wl, blocks, micro_batch, config, "cuda", modes=traced)
        return trace, tuple(target.calls)

    def _shared(self, key: tuple) -> None:
        """Where `key` (this GPU's attention class) has no trace yet but another class's trace of the same
        step exists whose every attention call runs the same kernel on this GPU (`same_kernels`: e.g. a
        head dim flash takes everywhere), that trace is this class's too, without tracing."""
        from .tracing.sdpa import same_kernels  # deferred: imports torch

        if key in self._traces or self.capability is None:
            return
        for other, trace in list(self._traces.items()):
            if other[:-1] == key[:-1] and isinstance(trace, MemoryTrace) and hasattr(trace, "attention"):
                capability, calls = trace.attention
                if same_kernels(calls, capability, self.capability):
                    self._traces[key] = trace
                    self._remember(key, trace)
                    return

    def trace(self, layers: int | None, micro_batch: int, config: StepConfig, modes: TrainingModes) -> MemoryTrace:
        """The step traced with `layers` blocks (None: as the workload is), without the rebuild."""
        key = self._key(layers, micro_batch, config, modes, False)
        self._shared(key)
        if key not in self._traces:
            self._traces[key] = self._run(key, config)
            self.traces_run += 1
        return self._traces[key]

    def rebuilt(self, layers: int | None, micro_batch: int, config: StepConfig,
                modes: TrainingModes, forked: tuple[dict, dict] | None = None) -> MemoryTrace | NotRebuilt:
        """The step as `estimate` traces it (a deep model config rebuilt from 3- and 4-block traces; a
        model config of `layers` blocks: a pipeline stage), or `NotRebuilt` with the small traces.
        `forked`: the small traces already run in forks, and their attention calls (plan/forks.py)."""
        key = self._key(layers, micro_batch, config, modes, True)
        self._shared(key)
        if key not in self._traces and forked is None:
            swapped = self._with_optimizer(layers, micro_batch, config, modes)
            if swapped is not None:
                self._traces[key] = swapped
        if key not in self._traces:
            try:
                self._traces[key] = self._run(key, config, forked)
                self.traces_run += traces_in(self._traces[key])
            except NotRebuilt as exc:
                self._traces[key] = exc
                self.traces_run += len(exc.traces)
        return self._traces[key]

    def _base(self, config: StepConfig, layers: int | None, modes: TrainingModes) -> StepConfig | None:
        """The step under AdamW, which `_with_optimizer` swaps another named optimizer into (None: it is AdamW or
        the workload's own, or the swap's check failed for this step before)."""
        return None if self._steps_key(layers, config, modes) in self._no_swap else swap_base(config)

    def _with_optimizer(self, layers: int | None, micro_batch: int, config: StepConfig,
                        modes: TrainingModes) -> MemoryTrace | None:
        """The step under `config`'s optimizer as the step under AdamW (rebuilt; traced here where not kept: it
        costs what this step's own trace would, and serves AdamW's option and every other optimizer's at this
        micro-batch) with the optimizer's steps swapped; None where there is no such step (it is AdamW's, or
        AdamW's was not rebuilt) or the swap's check fails (remembered: it does not depend on the micro-batch):
        then the step is traced itself."""
        base = self._base(config, layers, modes)
        if base is None:
            return None
        traced = self.rebuilt(layers, micro_batch, base, modes)
        if not isinstance(traced, MemoryTrace):
            return None
        own, other = (self._steps_of(layers, c, modes) for c in (base, config))
        swapped = with_optimizer(traced, own, other, config.optimizer, BASE_OPTIMIZER)
        if swapped is None:
            self._no_swap.add(self._steps_key(layers, config, modes))
        return swapped

    @staticmethod
    def _steps_key(layers: int | None, config: StepConfig, modes: TrainingModes) -> tuple:
        """What an optimizer's steps on the model depend on: blocks, step, modes (not the micro-batch)."""
        return layers, tuple(sorted(vars(config).items())), replace(modes, offload_optimizer=False, grad_accum=1)

    def _steps_of(self, layers: int | None, config: StepConfig, modes: TrainingModes):
        """`config`'s optimizer's two steps on the model, traced alone once per blocks, step and modes."""
        key = self._steps_key(layers, config, modes)
        if key not in self._optimizer_steps:
            self._optimizer_steps[key] = trace_optimizer_steps(self.wl, config, "cuda", modes=key[2], layers=layers)
        return self._optimizer_steps[key]

    def traced(self, micro_batch: int, config: StepConfig, modes: TrainingModes, split: Split,
               whole: bool = False) -> bool | None:
        """Whether `evaluate` (same arguments) would trace nothing: True (every trace it needs is kept), False
        (it would first trace what the forked workers run (plan/forks.py), given the same arguments and `whole`: the step as estimate
        traces it, or with `whole` the step traced whole where its rebuild failed), None (it would trace
        something they do not run: the small traces of an extrapolation). Traces nothing."""
        layers = self._layers(split)
        stage = layers if layers != self.layers else None
        key = self._key(stage, micro_batch, config, modes, True)
        self._shared(key)
        got = self._traces.get(key)
        base = self._base(config, stage, modes)
        if got is None and base is not None:  # AdamW's step, swapped (`_with_optimizer`), where that is rebuilt
            kept = self._traces.get(self._key(stage, micro_batch, base, modes, True))
            if kept is None:
                return False  # the workers trace AdamW's step
            if isinstance(kept, MemoryTrace):
                return True
        if got is None:
            return False
        if not isinstance(got, NotRebuilt):
            return True
        keys = [self._key(n, micro_batch, config, modes, False)
                for n in ([stage] if whole else [] if len(got.traces) == 2 else [1, 2])]
        for k in keys:
            self._shared(k)
        return all(k in self._traces for k in keys) or (False if whole else None)

    def _stage(self, split: Split) -> int | None:
        """The blocks a rank's trace has where that is not the model's (a pipeline stage's), else None."""
        layers = self._layers(split)
        return layers if layers != self.layers else None

    def _layers(self, split: Split) -> int | None:
        if self.layers is not None and split.strategy == "pipeline":
            return math.ceil(self.layers / split.nproc)
        return self.layers

    # -- numbers ----------------------------------------------------------------------------------
    def _point(self, trace: MemoryTrace, modes: TrainingModes, split: Split, block_param_bytes: int,
               param_bytes: int | None = None) -> Point:
        """One rank's numbers from `trace`: replayed once per trace, modes, split and the workspaces the GPU
        architecture puts into the replay (`--gpu all` asks again for every GPU, and a search for a micro-batch
        already tried; architectures with the same workspaces differ only in the CUDA context outside the
        allocator); a copy each time (`evaluate` adjusts it)."""
        key = (id(trace), modes, split, block_param_bytes, param_bytes, replay_inputs(self.arch))
        if key not in self._points:  # the trace is kept with its point: its id names no other trace
            self._points[key] = (trace, self._replayed(trace, modes, split, block_param_bytes, param_bytes), self.arch)
        _, done, arch = self._points[key]
        # replayed for an architecture with the same workspaces: only the CUDA context differs
        used = done.device_used_bytes - context_bytes(arch, module_loading()) + context_bytes(self.arch, module_loading())
        point = replace(done, device_used_bytes=used, by_category=dict(done.by_category), notes=list(done.notes),
                        phases=dict(done.phases))
        point.replayed_from = key
        return point

    def under_limit(self, point: Point, limit_bytes: int, nccl_bytes: int = 0) -> CudaMemory | None:
        """`point`'s step on a card offering `limit_bytes` where its replay with room reserves more: the
        replay under that cap (plan/memory/cuda.py; `nccl_bytes`, a rank's NCCL buffers, outside the allocator
        with the context), when the step runs so (by freeing the allocator's cache); None when it does not, or
        `point` is not one replay's (an extrapolation, a pipeline stage)."""
        if point.replayed_from is None or point.replayed_from not in self._points:
            return None
        key = (point.replayed_from, limit_bytes, self.arch, nccl_bytes)
        if key not in self._capped:
            trace, done, _ = self._points[point.replayed_from]
            modes, split, block, params = point.replayed_from[1:5]
            # its replay with room is this GPU's too: the same workspaces (`_point`: only the context differs)
            got = cuda_memory(self._ranked(trace, modes, split, block, params), self.arch, limit_bytes=limit_bytes,
                              roomy=done.free_replay, nccl_bytes=nccl_bytes)
            self._capped[key] = got if got.free is not None else None
        return self._capped[key]

    def _live_peak(self, trace: MemoryTrace) -> Peak:
        """`live_peak(trace)`, once per trace (`evaluate` asks for every option and GPU; kept with its trace:
        its id names no other trace). Read only."""
        if id(trace) not in self._peaks:
            self._peaks[id(trace)] = (trace, live_peak(trace))
        return self._peaks[id(trace)][1]

    def _param_bytes(self, trace: MemoryTrace) -> int:
        return self._live_peak(trace).by_category.get("parameters", 0)

    def _ranked(self, trace: MemoryTrace, modes: TrainingModes, split: Split, block_param_bytes: int,
                param_bytes: int | None) -> MemoryTrace:
        """One rank's trace of `trace` (the optimizer state offloaded where the modes say so)."""
        if modes.offload_optimizer:
            trace = offload_optimizer_state(trace)
        return rank_trace(trace, split, block_param_bytes, self.units(split), param_bytes,
                          accumulating=modes.grad_accum > 1)

    def _replayed(self, trace: MemoryTrace, modes: TrainingModes, split: Split, block_param_bytes: int,
                  param_bytes: int | None) -> Point:
        costs = trace.op_costs
        ranked = self._ranked(trace, modes, split, block_param_bytes, param_bytes)
        if modes.offload_optimizer:
            trace = offload_optimizer_state(trace)
        trainable = trainable_bytes(trace)
        cuda = cuda_memory(ranked, self.arch)
        peak = self._live_peak(trace) if ranked is trace else live_peak(ranked)
        phases, acts = phase_peaks(ranked)
        top = max((b for b, _ in phases.values()), default=0)
        # the replay's allocated peak can differ from the rounded live peak by the workspaces: keep both consistent
        point = Point(cuda.device_used_bytes, max(top, 0), dict(peak.by_category), int(trace.flops_per_step), trainable,
                      block_param_bytes, list(ranked.notes), phases, acts,
                      any("batch_norm" in e.op for e in trace.events[trace.steady_start:]), costs,
                      trainable_tensors=trainable_tensors(trace))
        point.free_replay = cuda.result
        return point

    def evaluate(self, micro_batch: int, config: StepConfig, modes: TrainingModes, split: Split,
                 whole: bool = False) -> Point:
        """One rank's numbers at `micro_batch` (FLOPs per optimizer step include the accumulation).
        `whole`: where the rebuild does not cover the step, trace it whole (estimate's way) rather than
        extrapolate."""
        layers = self._layers(split)
        stage = layers if layers != self.layers else None
        got = self.rebuilt(stage, micro_batch, config, modes)
        if whole and isinstance(got, NotRebuilt):
            got = self.trace(stage, micro_batch, config, modes)  # as estimate does after its rebuild failed
        if isinstance(got, NotRebuilt):
            point = self._extrapolated(got, micro_batch, config, modes, split, layers)
        else:  # estimate's numbers: its trace, its FSDP unit
            point = self._point(got, modes, split, block_param_bytes(got, layers, self._live_peak(got)))
        if layers is not None and split.strategy == "pipeline" and split.nproc > 1:
            point.replayed_from = None  # not the replay's numbers
            extra = (split.nproc - 1) * point.activations_bytes
            point.device_used_bytes += extra
            point.peak_allocated_bytes += extra
            point.notes.append(f"pipeline: stage 0 of {split.nproc} holds {split.nproc} micro-batches' "
                               f"activations (1F1B); {layers} of {self.layers} layers, embeddings and head "
                               "counted in the stage")
        if modes.grad_accum > 1:
            point.flops_per_step = point.flops_per_step * modes.grad_accum // modes.traced_micro_steps
            if point.op_costs is not None:
                point.op_costs = point.op_costs.scaled(modes.grad_accum / modes.traced_micro_steps)
        return point

    def _extrapolated(self, failed: NotRebuilt, micro_batch: int, config: StepConfig, modes: TrainingModes,
                      split: Split, layers: int) -> Point:
        """The labelled fallback: linear in the blocks between two small traces (the rebuild's 3- and
        4-unit ones when they ran, else 1 and 2 blocks)."""
        if len(failed.traces) == 2:
            (a, ta), (b, tb) = sorted(failed.traces.items())
            units = getattr(ta.layers, "units", None)  # the rebuild's units of blocks (a block each, or a period's)
            if units is not None:
                a, b = units.blocks(a), units.blocks(b)
        else:
            a, b = 1, 2
            ta, tb = (self.trace(n, micro_batch, config, modes) for n in (a, b))
        block = max((self._param_bytes(tb) - self._param_bytes(ta)) // (b - a), 0)
        # the whole model's parameter bytes: one block is `units.block` of them
        units = self.units(split)
        whole = int(block / units.block) if units is not None and units.block else None
        point = self._point(ta, modes, split, block, whole).extrapolate(
            self._point(tb, modes, split, block, whole), layers, (a, b))
        point.notes.append(f"numbers from traces with {a} and {b} of {self.layers} layers, extrapolated to {layers} "
                           f"(not rebuilt exactly: {failed.why}; estimate traces it whole)")
        return point
