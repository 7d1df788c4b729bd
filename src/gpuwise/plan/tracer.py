"""The one way into the tracer: a workload's training step at a batch size, with its modes, at a depth.

    trace_workload(workload, batch_size, config, target, modes=..., layers=..., repeat=..., whole=...) -> MemoryTrace
    trace_blocks(workload, blocks, batch_size, config, target, modes=...) -> MemoryTrace   (one small trace of `repeat`)
    trace_optimizer_steps(workload, config, target, modes=..., layers=...) -> OptimizerSteps
    with_optimizer(trace, own, other) -> MemoryTrace | None   (the step traced with `own`'s optimizer, under `other`'s)

`estimate`, `fit` (plan/scaled.py's Evaluator) and, through `estimate`, the hint and the largest-batch
search ask here; nothing else in plan/ imports the tracer's insides. What it does, in order:
- `layers`: a model config is rebuilt with that many blocks (a pipeline stage's; fit's labelled fallback);
- `modes` (plan/tracing/modes.py): LoRA / QLoRA / freezing / accumulation wrap the model and loss and are
  traced with the real libraries; offloading the optimizer is a transform of the trace, not a new one;
- `repeat`: a model config may be rebuilt exactly from its 3- and 4-block traces, its modes applied to
  each (plan/tracing/repeat.py); the notes say when it was traced whole instead, and why. With
  `whole=False` a deep model config that cannot be rebuilt is not traced whole: `NotRebuilt` says why and
  carries the 3- and 4-block traces already run (fit extrapolates from them, and says so). A caller may
  run the two small traces elsewhere (`trace_blocks`, side by side) and hand them in (`small=`), and a
  caller that rebuilt the same step at another micro-batch hands in its `block_residual` (`residual=`):
  only the 3-block trace runs;
- the step is traced on fake tensors (plan/tracing/trace.py), with a fallback where that cannot run.
Another optimizer is a transform of a traced step (plan/tracing/optimizer_swap.py): its two steps traced alone
on the whole model put in place of the traced optimizer's, found in the step event for event (None where not).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import warnings
from collections.abc import Callable
from dataclasses import replace

from ..errors import GpuwiseError, first_line
from ..hf import with_layers
from ..step import StepConfig
from ..workload import Workload, load_workload
from .memory.events import MemoryTrace
from .tracing.modes import TrainingModes, apply_modes, offload_optimizer_state
from .tracing.optimizer_swap import OptimizerSteps, optimizer_steps, swapped
from .tracing.repeat import BlockResidual, repeated_trace, small_trace

Progress = Callable[[str], None]  # told each stage as it starts


def collector_paused(fn):
    """`fn` runs with Python's cyclic garbage collector paused (re-enabled after, as it was): `estimate`, `fit`
    and `fit --gpu all`. Their traces build about a million long-lived objects (events, allocator blocks, fake
    tensors), and the collector's full passes over them free almost nothing: without them the answers are the
    same, a 7B fit gained 2-3 s (max RSS +4 %, fit examples/configs/llama-2-7b.json --gpu rtx4090: 478 -> 496
    MB) and a 7B estimate 1.5 s of 12.4 (estimate examples/configs/llama-2-7b.json -b 4 --gpu rtx4090 on one
    CPU, twice each way). Reference counting still frees everything not in a cycle."""
    @functools.wraps(fn)
    def paused(*args, **kwargs):
        if not gc.isenabled():
            return fn(*args, **kwargs)
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.enable()
    return paused


class NotRebuilt(Exception):
    """A deep model config's step could not be rebuilt from its repeated blocks (`trace_workload(...,
    repeat=True, whole=False)`): `why`, and `traces`, the small traces run on the way, by block count
    (empty when none ran)."""

    def __init__(self, why: str, traces: dict[int, MemoryTrace]):
        super().__init__(why)
        self.why, self.traces = why, traces


def trace_workload(workload: Workload | str, batch_size: int, config: StepConfig, target: str, repeat: bool = False,
                   progress: Progress | None = None, *, modes: TrainingModes | None = None,
                   layers: int | None = None, whole: bool = True,
                   small: dict[int, MemoryTrace] | None = None,
                   residual: BlockResidual | None = None) -> MemoryTrace:
    """The step's events (see the module's docstring). `small`: with `repeat`, the 3- and 4-block traces
    already run (`trace_blocks`', e.g. side by side in forks), by block count; the rebuild uses them.
    `residual`: with `repeat`, the same step's `block_residual` from another micro-batch's rebuild (its 4-block
    check): this one's 4-block trace is not run."""
    wl = given = load_workload(workload)
    if layers is not None:
        wl = with_layers(wl, layers)
    offload = modes is not None and modes.offload_optimizer

    def steps_of(c: StepConfig) -> OptimizerSteps:  # an optimizer's steps alone, once per workload, step, modes
        return _steps_kept(given, c, target, modes, layers)

    wl, shaped = _with_modes(wl, modes, config)
    with quiet_libraries():
        trace = _traced(wl, batch_size, config, target, repeat, progress, shaped, whole, small, residual, steps_of)
    if not offload:
        return trace
    off = offload_optimizer_state(trace)
    off.op_costs = trace.op_costs
    return off


def trace_blocks(workload: Workload | str, blocks: int, batch_size: int, config: StepConfig, target: str, *,
                 modes: TrainingModes | None = None) -> MemoryTrace:
    """One of the small traces a deep model config's step is rebuilt from (`repeat`): the model with `blocks`
    blocks, its modes applied, traced as the rebuild traces it. Run side by side, they are handed to
    `trace_workload(..., repeat=True, small=...)`, which rebuilds from them as if it had traced them."""
    wl, shaped = _with_modes(load_workload(workload), modes, config)
    with quiet_libraries():
        return small_trace(wl, blocks, batch_size, config, target, shaped)


def trace_optimizer_steps(workload: Workload | str, config: StepConfig, target: str, *,
                          modes: TrainingModes | None = None, layers: int | None = None) -> OptimizerSteps:
    """`config`'s optimizer made and stepping twice on the workload's model (`layers` blocks, `modes` applied), as
    the step's trace records them: what `with_optimizer` puts into (and finds in) a traced step."""
    wl = load_workload(workload)
    if layers is not None:
        wl = with_layers(wl, layers)
    wl, _ = _with_modes(wl, modes, config)
    with quiet_libraries():
        return optimizer_steps(wl, config, target)


def with_optimizer(trace: MemoryTrace, own: OptimizerSteps, other: OptimizerSteps, name: str,
                   base: str) -> MemoryTrace | None:
    """`trace` (traced with optimizer `base`, whose steps are `own`) with optimizer `name`'s steps (`other`) in
    their place; None where `own`'s steps are not found in it event for event (then trace the step itself)."""
    return swapped(trace, own, other, f"optimizer: {name}'s steps traced alone on the whole model, in place of "
                                      f"{base}'s in the step traced with {base} (found there event for event)")


BASE_OPTIMIZER = "adamw"  # the optimizer whose rebuilt step another's steps are swapped into


def swap_base(config: StepConfig) -> StepConfig | None:
    """The step under AdamW that `config`'s optimizer's steps are swapped into (`with_optimizer`); None where
    `config` is AdamW's own step or the workload's optimizer (unnamed)."""
    if config.optimizer in (None, BASE_OPTIMIZER):
        return None
    return replace(config, optimizer=BASE_OPTIMIZER)


def _in_adamws_step(wl: Workload, batch_size: int, config: StepConfig, target: str, progress: Progress | None,
                    shaped: Callable[[Workload], Workload] | None, why: str,
                    steps_of: Callable[[StepConfig], OptimizerSteps]) -> MemoryTrace | None:
    """A step under another named optimizer whose own blocks were not reused (`why`: Adafactor's 4-block check
    fails): AdamW's step rebuilt, that optimizer's steps swapped in (checked event for event, the same events as
    the step traced whole: tests/test_plan_optimizer_swap.py), instead of tracing L blocks. None where AdamW's step
    is not rebuilt either or the swap refuses: then the step is traced whole."""
    base = swap_base(config)
    if base is None:
        return None
    try:
        rebuilt, _ = repeated_trace(wl, batch_size, base, target, progress, shaped, {}, None)
        if rebuilt is None:
            return None
        if progress is not None:
            progress(f"tracing {BASE_OPTIMIZER}'s and {config.optimizer}'s steps alone")
        out = with_optimizer(rebuilt, steps_of(base), steps_of(config), config.optimizer, BASE_OPTIMIZER)
    except Exception:  # noqa: BLE001 - whatever the swap cannot do, the whole trace handles (and reports)
        return None
    if out is not None:
        out.notes.append(f"{config.optimizer}'s own step: repeated blocks not reused ({why})")
    return out


_STEPS: dict[tuple, tuple[Workload, OptimizerSteps]] = {}  # `_steps_kept`'s, with the workload its key's id names


def _steps_kept(wl: Workload, config: StepConfig, target: str, modes: TrainingModes | None,
                layers: int | None) -> OptimizerSteps:
    """`trace_optimizer_steps`, kept for the same workload object, step, target, modes and blocks: estimate's
    largest-batch search asks the same optimizer's steps at every batch size (a few kept, the last ones)."""
    key = (id(wl), tuple(sorted(vars(config).items())), target, modes, layers)
    kept = _STEPS.get(key)
    if kept is None or kept[0] is not wl:
        if len(_STEPS) >= 8:
            _STEPS.pop(next(iter(_STEPS)))
        kept = _STEPS[key] = (wl, trace_optimizer_steps(wl, config, target, modes=modes, layers=layers))
    return kept[1]


def _with_modes(wl: Workload, modes: TrainingModes | None, config: StepConfig):
    """`wl` with the training modes applied (offload aside: a transform of the trace), and what applies
    them to the small models of the repeated blocks (None without modes)."""
    if modes is None:
        return wl, None
    traced_modes = replace(modes, offload_optimizer=False)

    def shaped(small: Workload) -> Workload:  # the small models of the repeated blocks get the same modes
        return apply_modes(small, traced_modes, config.precision)
    return shaped(wl), shaped


# what the libraries a trace runs say about the stand-in CPU step, not about the user's job: deprecations inside
# them (peft reading transformers' is_gradient_checkpointing), bitsandbytes' CPU kernels not found, transformers
# turning the cache off under checkpointing; once per trace, and per forked trace again
LIBRARIES = ("transformers", "peft", "bitsandbytes", "accelerate", "torch")


@contextlib.contextmanager
def quiet_libraries():
    """Inside: the libraries' deprecation warnings and their loggers' notices below ERROR are not shown (the
    user's own code still warns as it runs)."""
    loggers = [logging.getLogger(name) for name in LIBRARIES]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        for category in (FutureWarning, DeprecationWarning):
            warnings.filterwarnings("ignore", category=category, module=rf"({'|'.join(LIBRARIES)})(\.|$)")
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


def _traced(wl: Workload, batch_size: int, config: StepConfig, target: str, repeat: bool,
            progress: Progress | None, shaped: Callable[[Workload], Workload] | None = None,
            whole: bool = True, small: dict[int, MemoryTrace] | None = None,
            residual: BlockResidual | None = None,
            steps_of: Callable[[StepConfig], OptimizerSteps] | None = None) -> MemoryTrace:
    from .tracing.trace import trace_step  # deferred: trace.py imports torch, `import gpuwise.plan` must not

    why = ""
    if repeat:
        small = dict(small or {})
        rebuilt, why = repeated_trace(wl, batch_size, config, target, progress, shaped, small, residual)
        if rebuilt is not None:
            return rebuilt
        if why and not whole:
            raise NotRebuilt(why, small)
        if why and steps_of is not None:
            swapped_in = _in_adamws_step(wl, batch_size, config, target, progress, shaped, why, steps_of)
            if swapped_in is not None:
                return swapped_in
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
        raise GpuwiseError(f"{wl.spec}: the training step raised {type(exc).__name__}: {first_line(exc)}") from exc
