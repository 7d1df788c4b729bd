"""fit's searches side by side: each search runs over the traces kept up to the first trial that needs another
(`Untraced`); every search's such trial is handed to forked workers (`Evaluator.forks`), and as soon as one comes
back the searches run again over what is kept, asking their next trials while the workers trace the others. The
searches ask the same trials as one by one, so the answers are the same; only when the traces run differs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from ..errors import GpuwiseError
from .catalog import GpuSpec
from .estimate import gpu_capability
from .forks import idle_cpus
from .scaled import Evaluator


class Untraced(Exception):
    """A search run with `ready=True` reached a trial that needs a trace not kept yet: `ask` (what `Forks.submit`
    gets for it), or None where it needs a trace that the workers do not run; `then`: the trial likely asked
    next, traced beside it where a worker would idle otherwise."""

    def __init__(self, ask: tuple | None):
        super().__init__(ask)
        self.ask = ask
        self.then: list[tuple] = []


def side_by_side(ev: Evaluator, searches: list[tuple[GpuSpec, float, Any, bool]], batch: int, search: Callable,
                 every_gpu: bool, progress: Callable[[str], None] | None = None) -> None:
    """Run `searches` (each: the GPU's spec, its usable bytes, the variant, whole_first) with their trials traced
    by forked workers, one per idle CPU: `search(ev, variant, spec, batch, limit, whole_first, ready=True)` goes over
    the traces kept and raises `Untraced` at the first trial that needs another; every search's such trial is
    handed to the workers (`Forks.submit`) and, each time a trace comes back, the searches run again, until no
    search asks a trace that the workers run and none is being traced (plan/fit.py `_side_by_side`, and
    plan/fit_gpus.py `_side_by_side_gpus` with `every_gpu`: each search on its own GPU). A search's likely next
    trial (`Untraced.then`) is handed out too where a worker would idle. `progress` is told the traces run so far
    each time some come back. With one idle CPU nothing runs here: the searches trace as they ask."""
    gpus = {spec.id: (spec.arch, gpu_capability(spec)) for spec, *_ in searches} if every_gpu else {}
    variants = [v for _, _, v, _ in searches]
    asked: set[tuple] = set()
    asks, then = _asks(ev, searches, batch, search, gpus, asked)
    if not asks:
        return  # every trace asked is kept (`--gpu all`'s fit of each GPU after its side-by-side searches): no fork
    with ev.forks(idle_cpus(), [v.modes for v in variants], [v.config for v in variants]) as workers:
        if workers is None:
            return
        while True:
            workers.submit(asks)
            workers.submit(then, spare=True)  # a likely next trial, on a worker that would idle
            asked.update(_ask_key(a) for a in asks)  # asked once: a trace that raised in its worker runs here
            if not workers.needed:
                return
            workers.wait()
            if progress is not None:
                progress(f"{ev.traces_run} traces so far")
            asks, then = _asks(ev, searches, batch, search, gpus, asked, workers)


def _asks(ev: Evaluator, searches: list[tuple[GpuSpec, float, Any, bool]], batch: int, search: Callable,
          gpus: dict, asked: set[tuple], workers: Any = None) -> tuple[list[tuple], list[tuple]]:
    """Every search's next trial not asked yet (a step asked under two attention classes: the first only; the
    other is asked again once that is back, where `same_kernels` may share it), and the trials likely asked next.
    `workers`: the `Forks` tracing the trials asked before (None: none yet)."""
    asks, then, steps = [], [], {}  # steps: a step asked now -> the attention class asking it
    flying = workers.flying if workers is not None else lambda _ask: False
    for spec, limit, v, whole_first in searches:
        gpu = gpus.get(spec.id)
        try:
            with ev.on_gpu(*gpu) if gpu else contextlib.nullcontext():
                search(ev, v, spec, batch, limit, whole_first, ready=True)
        except Untraced as untraced:
            ask = _from(untraced.ask, gpu)
            if ask is None or _ask_key(ask) in asked:
                continue
            if steps.setdefault(_ask_key(ask, step=True), _ask_key(ask)) != _ask_key(ask) or flying(ask):
                continue  # another attention class asks this step: asked again once that is back
            asks.append(ask)
            then += [a for a in (_from(t, gpu) for t in untraced.then)
                     if _ask_key(a) not in asked and _ask_key(a, step=True) not in steps and not flying(a)]
        except GpuwiseError:
            pass  # raised again where the search runs for its answer
    return asks, then


def _from(ask: tuple | None, gpu: tuple[str, tuple[int, int] | None] | None) -> tuple | None:
    """`ask` as `Forks.submit` takes it: (micro-batch, step, modes, split[, whole]), and where the searches are
    every GPU's (`gpu`: the asking GPU's architecture and compute capability) whole, capability, architecture."""
    if ask is None or gpu is None:
        return ask
    return (*ask[:4], len(ask) > 4 and ask[4], gpu[1], gpu[0])


def _ask_key(ask: tuple, step: bool = False) -> tuple:
    """What tells asks apart: the step (`step`: only that), whether traced whole, and the asking GPU's
    attention class where the ask names its GPU's capability (`_from`)."""
    micro, config, modes, split, *more = ask
    key = (micro, tuple(sorted(vars(config).items())), modes, split, bool(more and more[0]))
    if len(more) > 1 and not step:
        from .tracing.sdpa import kernel_class  # deferred: imports torch

        key += (kernel_class(more[1]),)
    return key
