"""fit's searches in rounds: each search over the traces kept up to the first trial that needs another
(`Untraced`), then every search's such trial traced side by side (`Evaluator.prefetch`), and again. The
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
    """A search run with `ready=True` reached a trial that needs a trace not kept yet: `ask` (what `prefetch`
    gets for it), or None where it needs a trace that `prefetch` does not run; `then`: the trial likely asked
    next, traced beside it where a CPU would idle otherwise."""

    def __init__(self, ask: tuple | None):
        super().__init__(ask)
        self.ask = ask
        self.then: list[tuple] = []


def in_rounds(ev: Evaluator, searches: list[tuple[GpuSpec, float, Any, bool]], batch: int, search: Callable,
              every_gpu: bool, progress: Callable[[str], None] | None = None) -> None:
    """Run `searches` (each: the GPU's spec, its usable bytes, the variant, whole_first) in rounds of
    `ev.prefetch`: `search(ev, variant, spec, batch, limit, whole_first, ready=True)` goes over the traces kept
    and raises `Untraced` at the first trial that needs another; every search's such trial is traced side by
    side, then again, until no search asks a trace that `prefetch` runs (plan/fit.py `_side_by_side`, and
    plan/fit_gpus.py `_side_by_side_gpus` with `every_gpu`: each search on its own GPU). `progress` is told
    each round as it starts: its number and the traces run so far."""
    asked: set[tuple] = set()
    rounds = 0
    gpus = {spec.id: (spec.arch, gpu_capability(spec)) for spec, *_ in searches} if every_gpu else {}
    while True:
        asks, then, steps = [], [], {}  # steps: a step asked this round -> the attention class asking it
        for spec, limit, v, whole_first in searches:
            gpu = gpus.get(spec.id)
            try:
                with ev.on_gpu(*gpu) if gpu else contextlib.nullcontext():
                    search(ev, v, spec, batch, limit, whole_first, ready=True)
            except Untraced as untraced:
                ask = _from(untraced.ask, gpu)
                if ask is None or _ask_key(ask) in asked:
                    continue
                if steps.setdefault(_ask_key(ask, step=True), _ask_key(ask)) != _ask_key(ask):
                    continue  # another attention class asks this step this round: asked again next round
                asks.append(ask)
                then += [a for a in (_from(t, gpu) for t in untraced.then)
                         if _ask_key(a) not in asked and _ask_key(a, step=True) not in steps]
            except GpuwiseError:
                pass  # raised again where the search runs for its answer
        if not asks:
            return
        asks += then[:max(idle_cpus() - len(asks), 0)]  # a likely next trial, on a CPU that would idle
        before = ev.traces_run
        rounds += 1
        if progress is not None:
            progress(f"round {rounds} ({before} traces so far)")
        ev.prefetch(asks)
        if ev.traces_run == before:
            return  # nothing ran side by side
        asked.update(_ask_key(a) for a in asks)  # asked once: a trace that raised in its fork runs here


def _from(ask: tuple | None, gpu: tuple[str, tuple[int, int] | None] | None) -> tuple | None:
    """`ask` as `prefetch` takes it: (micro-batch, step, modes, split[, whole]), and where the searches are
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
