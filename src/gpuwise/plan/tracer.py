"""The one way into the tracer: a workload's training step at a batch size, with its modes, at a depth.

    trace_workload(workload, batch_size, config, target, modes=..., layers=..., repeat=...) -> MemoryTrace

`estimate`, `fit` (plan/deep/scaled.py's Evaluator) and, through `estimate`, the hint and the largest-batch
search ask here; nothing else in plan/ imports the tracer's insides. What it does, in order:
- `layers`: a model config is rebuilt with that many blocks (fit's 1- and 2-block traces);
- `modes` (plan/tracing/modes.py): LoRA / QLoRA / freezing / accumulation wrap the model and loss and are
  traced with the real libraries; offloading the optimizer is a transform of the trace, not a new one;
- `repeat`: a model config (with its modes) is rebuilt exactly from its 3- and 4-block traces where the
  4-block trace proves the rebuild (plan/deep/repeat.py); the notes say when it was traced whole
  instead, and why;
- the step is traced on fake tensors (plan/tracing/trace.py), with a fallback where that cannot run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..errors import GpuwiseError
from ..hf import hf_workload
from ..step import StepConfig
from ..workload import Workload, load_workload
from .deep.repeat import repeated_trace
from .memory.events import MemoryTrace
from .tracing.modes import TrainingModes, apply_modes, offload_optimizer_state

Progress = Callable[[str], None]  # told each stage as it starts


def trace_workload(workload: Workload | str, batch_size: int, config: StepConfig, target: str, repeat: bool = False,
                   progress: Progress | None = None, *, modes: TrainingModes | None = None,
                   layers: int | None = None) -> MemoryTrace:
    """The step's events (see the module's docstring): rebuilt from 3 and 4 blocks where `repeat` and that
    is exact, else traced whole (at `layers` blocks when given)."""
    why = ""
    if repeat:
        rebuilt, why = rebuilt_trace(workload, batch_size, config, target, progress, modes=modes, layers=layers)
        if rebuilt is not None:
            return rebuilt
    wl = load_workload(workload)
    if layers is not None:
        wl = hf_workload(wl.source, wl.seq_len, wl.task, num_layers=layers)
    traced_modes = _traced_modes(modes)
    if traced_modes is not None:
        wl = apply_modes(wl, traced_modes, config.precision)
    return _offloaded(_traced(wl, batch_size, config, target, why, progress), modes)


def rebuilt_trace(workload: Workload | str, batch_size: int, config: StepConfig, target: str,
                  progress: Progress | None = None, *, modes: TrainingModes | None = None,
                  layers: int | None = None) -> tuple[MemoryTrace | None, str]:
    """A model config's step rebuilt exactly from its 3- and 4-block traces (plan/deep/repeat.py), with
    `modes`, at `layers` blocks (default: the config's); (None, why) where that is not exact."""
    rebuilt, why = repeated_trace(load_workload(workload), batch_size, config, target, progress,
                                  modes=_traced_modes(modes), layers=layers)
    return (_offloaded(rebuilt, modes) if rebuilt is not None else None), why


def _traced_modes(modes: TrainingModes | None) -> TrainingModes | None:
    """The modes the trace runs (None: the model and loss as loaded); offload is a transform after it."""
    if modes is None or not (modes.grad_accum > 1 or modes.adapters or modes.freeze):
        return None  # apply_modes would hand the workload back unchanged
    return replace(modes, offload_optimizer=False)


def _offloaded(trace: MemoryTrace, modes: TrainingModes | None) -> MemoryTrace:
    if modes is None or not modes.offload_optimizer:
        return trace
    off = offload_optimizer_state(trace)
    off.op_costs = trace.op_costs
    return off


def _traced(wl: Workload, batch_size: int, config: StepConfig, target: str, why: str,
            progress: Progress | None) -> MemoryTrace:
    from .tracing.trace import trace_step  # deferred: trace.py imports torch, `import gpuwise.plan` must not

    if progress is not None:
        progress(f"tracing the step at batch {batch_size}")
    try:
        trace = trace_step(wl, batch_size, config, target=target)
        if why:
            trace.notes.append(f"traced whole: repeated blocks not reused ({why})")
        return trace
    except GpuwiseError:
        raise
    except Exception as exc:  # the user's model failed in its step: one line, the cause chained for --debug
        first = (str(exc).strip().splitlines() or [""])[0]
        raise GpuwiseError(f"{wl.spec}: the training step raised {type(exc).__name__}: {first}") from exc
