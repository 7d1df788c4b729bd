"""`gpuwise fit --gpu all` and the time and cost to train: every listed catalog GPU's options side by side (the
traces shared, only each GPU's replay and attention kernels its own), and each GPU's time and cost to train on a
number of tokens or samples at its fastest fitting option (plan/speed/cost.py: renting and owning)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import GpuwiseError
from .catalog import CATALOG, GpuSpec, lookup
from .curve import DEFAULT_MARGIN_PCT
from .fit import FitResult, best_micro_batch, candidates_on, fit, searched_variants
from .fit_options import Variant
from .inputs import resolve_inputs
from .scaled import Evaluator
from .side_by_side import side_by_side
from .speed.cost import training_cost
from .tracer import collector_paused


@collector_paused
def fit_all_gpus(workload: Any, nproc: int = 1, batch_size: int = 8, progress: Callable[[str], None] | None = None,
                 **kw) -> list[FitResult]:
    """`--gpu all`: every listed catalog GPU (x nproc); the traces are shared, only the replay differs. Every
    GPU's searches run side by side first (`_side_by_side_gpus`); each GPU's `fit` then finds its traces kept."""
    wl, batch_size = resolve_inputs(workload, batch_size, seq_len=kw.pop("seq_len", None), task=kw.pop("task", None),
                                    target_len=kw.pop("target_len", None))
    ev = Evaluator(wl, "hopper")
    source = workload if isinstance(workload, str) else None
    specs = [spec for spec in CATALOG.values() if spec.listed]

    def told(i: int, spec: GpuSpec) -> Callable[[str], None] | None:  # one stage per GPU, not per option
        return None if progress is None else lambda _stage: progress(f"GPU {i}/{len(specs)}, {spec.name}")

    side = f"{len(specs)} GPUs' options: the traces, side by side"
    every = None if progress is None else lambda r: progress(f"{side}, {r}")
    if specs and progress is not None:
        progress(side)
    searches = []
    for spec in specs:
        limit, candidates, floors, whole = candidates_on(
            ev, spec, nproc, kw.get("precision", "fp32"), kw.get("optimizer"), kw.get("checkpointing", False),
            kw.get("margin_pct", DEFAULT_MARGIN_PCT), kw.get("accum_sync"), kw.get("cross_entropy", "model"),
            kw.get("train_metrics", 0))
        searches += [(spec, limit, v, w) for v, w in searched_variants(candidates, floors, whole)]
    _side_by_side_gpus(ev, searches, batch_size, every)
    return [fit(wl, spec, nproc, batch_size, evaluator=ev, source=source, progress=told(i, spec), **kw)
            for i, spec in enumerate(specs, 1)]


def _side_by_side_gpus(ev: Evaluator, searches: list[tuple[GpuSpec, float, Variant, bool]], batch: int,
                       progress: Callable[[str], None] | None = None) -> None:
    """`--gpu all`: every GPU's searches (its spec, usable bytes, variant, whole_first) side by side, each
    evaluated on its own GPU (`Evaluator.on_gpu`) and its traces asked under that GPU's attention kernels: the
    workers trace the trials of all GPUs, where one GPU's searches alone leave CPUs idle. The trials are each
    search's own, as in plan/fit.py's side-by-side searches, so the answers are too; a step asked by GPUs of two
    attention classes is handed out for the first only, and asked by the others again once it is back, where
    `same_kernels` may share its trace (as when the GPUs were fitted one after another): no trace runs that did
    not before."""
    side_by_side(ev, searches, batch, best_micro_batch, every_gpu=True, progress=progress)


def attach_costs(results: list[FitResult], tokens: float | None = None, samples: float | None = None,
                 rent: dict[str, float] | None = None, buy: dict[str, float] | None = None) -> None:
    """Each result's time and cost to train on `tokens` (sequence models) or `samples`, at its fastest
    fitting option's predicted speed (plan/speed/cost.py prices unless `rent` / `buy` give them)."""
    if (tokens is None) == (samples is None):
        raise GpuwiseError("give the training length as tokens or as samples (one of them)")
    for r in results:
        if not r.fitting:
            continue
        if tokens is not None and not r.tokens_per_sample:
            raise GpuwiseError("--tokens needs a sequence model (a model config with --seq-len); use --samples")
        total = samples if samples is not None else tokens / r.tokens_per_sample
        spec = lookup(r.gpu) if r.gpu not in {s.name for s in CATALOG.values()} else \
            next(s for s in CATALOG.values() if s.name == r.gpu)
        best = r.fitting[0]
        r.cost = training_cost(spec.id, best.changes.get("nproc") or r.nproc, best.samples_per_s, total, rent, buy)
