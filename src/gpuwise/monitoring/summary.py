"""Timeline -> the docs/contracts.md monitor summary (plus extras), then the diagnosis rules' findings.

Contract fields: `steps`, `step_time_s.median`, `data_wait_fraction`, `copy_fraction`,
`compute_fraction`, `findings`. The fractions are sums over the steady steps (the first step of each
rank is warm-up: worker start, CUDA context, allocator growth) divided by their total time; they are
null when no per-step timing was recorded (an external `watch` of a script without the monitor).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from ..plan.catalog import tensor_core_capability
from . import communication  # noqa: F401 - registers the communication / thread rules
from .health import health_stats
from .noise_scale import noise_scale
from .result import EXTRA_KEYS, PARALLEL_KEYS, Summary
from .rules import diagnose
from .timeline import StepRecord, Timeline

WARMUP_STEPS = 1
LOW_UTIL_PCT = 10.0   # a sample at or below this counts as "idle" (nvidia-smi's 0-10% flicker)
HIGH_UTIL_PCT = 90.0  # at or above: "busy"


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _steady(steps: list[StepRecord]) -> list[StepRecord]:
    by_rank: dict[int, list[StepRecord]] = {}
    for s in steps:
        by_rank.setdefault(s.rank, []).append(s)
    out = []
    for rank_steps in by_rank.values():
        out.extend(rank_steps[WARMUP_STEPS:] if len(rank_steps) > WARMUP_STEPS + 1 else rank_steps)
    return out


def step_split(steps: list[StepRecord]) -> dict[str, Any]:
    """Fractions of step time and per-step medians over `steps` (already the steady ones)."""
    total = sum(s.total_s for s in steps)
    if not steps or total <= 0:
        return {"data_wait_fraction": None, "copy_fraction": None, "compute_fraction": None,
                "communication_fraction": None, "step_time_s": {"median": None}}
    gpu = [s.gpu_s for s in steps if s.gpu_s is not None]
    idle = [s.gpu_idle_s for s in steps if s.gpu_idle_s is not None]
    comm = [s.comm_s for s in steps if s.comm_s is not None]
    return {
        "step_time_s": {"median": _median([s.total_s for s in steps]), "mean": total / len(steps),
                        "min": min(s.total_s for s in steps), "max": max(s.total_s for s in steps)},
        "data_wait_fraction": sum(s.data_s for s in steps) / total,
        "copy_fraction": sum(s.copy_s for s in steps) / total,
        "compute_fraction": sum(s.compute_s for s in steps) / total,
        # None: not measured (no bootstrap hooks); 0.0: measured, no collective seen
        "communication_fraction": sum(comm) / total if comm else None,
        "data_wait_s": {"median": _median([s.data_s for s in steps])},
        "copy_s": {"median": _median([s.copy_s for s in steps])},
        "compute_s": {"median": _median([s.compute_s for s in steps])},
        "comm_s": {"median": _median(comm)} if comm else None,
        "gpu_s": {"median": _median(gpu)} if gpu else None,
        "gpu_idle_fraction": sum(idle) / total if idle else None,
    }


def utilization_stats(tl: Timeline, window: tuple[float, float] | None) -> dict[str, Any]:
    """GPU utilisation over the samples inside `window` (the steady steps, when there are steps)."""
    utils, used, totals, power, limits = [], [], [], [], []
    for s in tl.samples:
        if window and not (window[0] <= s.t_s <= window[1]):
            continue
        for g in s.gpus.values():
            if g.get("utilization_pct") is not None:
                utils.append(float(g["utilization_pct"]))
            if g.get("memory_used_bytes") is not None:
                used.append(float(g["memory_used_bytes"]))
            if g.get("memory_total_bytes"):
                totals.append(float(g["memory_total_bytes"]))
            if g.get("power_w") is not None:
                power.append(float(g["power_w"]))
            if g.get("power_limit_w"):
                limits.append(float(g["power_limit_w"]))
    if not utils:
        return {"samples": 0}
    n = len(utils)
    return {
        "samples": n, "mean_pct": sum(utils) / n, "median_pct": _median(utils),
        "low_fraction": sum(u <= LOW_UTIL_PCT for u in utils) / n,
        "high_fraction": sum(u >= HIGH_UTIL_PCT for u in utils) / n,
        "memory_used_peak_bytes": max(used) if used else None,
        "memory_total_bytes": max(totals) if totals else None,
        "power_mean_w": sum(power) / len(power) if power else None,
        "power_limit_w": max(limits) if limits else None,
    }


def host_stats(tl: Timeline) -> dict[str, Any]:
    cpu = [s.cpu_pct for s in tl.samples if s.cpu_pct is not None]
    proc = [s.proc_cpu_pct for s in tl.samples if s.proc_cpu_pct is not None]
    rss = [s.rss_bytes for s in tl.samples if s.rss_bytes is not None]
    return {"cpu_count": tl.meta.get("cpu_count"), "cpu_mean_pct": sum(cpu) / len(cpu) if cpu else None,
            "process_cpu_mean_pct": sum(proc) / len(proc) if proc else None, "rss_peak_bytes": max(rss) if rss else None}


def per_rank(steps: list[StepRecord]) -> list[dict[str, Any]]:
    ranks = sorted({s.rank for s in steps})
    rows = []
    for r in ranks:
        mine = [s for s in steps if s.rank == r]
        split = step_split(mine)
        rows.append({"rank": r, "steps": len(mine), "step_time_s_median": split["step_time_s"]["median"],
                     "data_wait_fraction": split["data_wait_fraction"],
                     "communication_fraction": split["communication_fraction"]})
    return rows


# (workload, batch size, GPU name, precision) -> the planner's largest batch on that GPU, or None;
# `gpuwise.plan.hint.ask_max_batch` behind it, chosen by the caller (see `planner_max_batch`)
MaxBatchPlanner = Callable[[str, int, str, str], "int | None"]


def summarize(tl: Timeline, planner: MaxBatchPlanner | None = None) -> dict[str, Any]:
    """The summary dict (contract + extras): `summary_of(...).to_dict()`."""
    return summary_of(tl, planner).to_dict()


def summary_of(tl: Timeline, planner: MaxBatchPlanner | None = None) -> Summary:
    """The summary (contract + extras) with `findings` from the rule registry.

    `planner`, when given, is asked for the largest batch on this GPU when a CUDA run used under half
    of its memory and the run's workload, batch size and GPU are known (the low_memory_use finding names it)."""
    steady = _steady(tl.steps)
    split = step_split(steady)
    window = (min(s.start_s for s in steady), max(s.start_s + s.total_s for s in steady)) if steady else None
    util = utilization_stats(tl, window)
    if util["samples"] == 0 and window is not None:
        util = utilization_stats(tl, None)  # a run shorter than one sampling interval
    meta = tl.meta
    device = str(meta.get("device") or ("cuda" if util["samples"] else "cpu"))
    total_bytes = meta.get("device_total_bytes") or util.get("memory_total_bytes")
    used = [v for v in (meta.get("peak_reserved_bytes"), util.get("memory_used_peak_bytes")) if v]
    capability = meta.get("capability") or tensor_core_capability(meta.get("device_name") or "")
    summary = Summary(
        steps=len(tl.steps),
        step_time_s=split["step_time_s"],
        data_wait_fraction=split["data_wait_fraction"],
        copy_fraction=split["copy_fraction"],
        compute_fraction=split["compute_fraction"],
        communication_fraction=split["communication_fraction"],
        steady_steps=len(steady),
        split={k: v for k, v in split.items() if k not in ("step_time_s", "data_wait_fraction", "copy_fraction",
                                                             "compute_fraction", "communication_fraction")},
        device=device,
        device_name=meta.get("device_name"),
        capability=list(capability) if capability else None,
        precision=meta.get("precision"),
        batch_size=meta.get("batch_size"),
        loader={k[len("loader_"):]: v for k, v in meta.items() if k.startswith("loader_")},
        pinned_fraction=meta.get("pinned_fraction"),
        batch_bytes=meta.get("batch_bytes"),
        utilization=util,
        memory={"device_total_bytes": total_bytes, "peak_allocated_bytes": meta.get("peak_allocated_bytes"),
                "peak_reserved_bytes": meta.get("peak_reserved_bytes"),
                "device_used_peak_bytes": util.get("memory_used_peak_bytes"),
                "use_fraction": max(used) / total_bytes if used and total_bytes else None,
                "planner_max_batch_size": None},
        host=host_stats(tl),
        ranks=per_rank(steady) if len({s.rank for s in steady}) > 1 else [],
        notes=list(tl.notes),
        parallel={key: meta[key] for key in PARALLEL_KEYS if key in meta},
        extras={key: meta[key] for key in EXTRA_KEYS if key in meta},
    )
    workload, name, batch = meta.get("workload"), meta.get("device_name"), meta.get("batch_size")
    if (planner is not None and summary.on_gpu and (summary.memory["use_fraction"] or 1) < 0.5
            and workload and name and batch):
        summary.memory["planner_max_batch_size"] = planner(workload, batch, name, meta.get("precision") or "fp32")
    summary.gpu_health = health_stats(tl, window)  # clock reasons, PCIe link (monitoring/health.py rules)
    summary.gradient_noise_scale = noise_scale(tl.noise, meta.get("batch_size"))
    summary.findings = [f.to_dict() for f in diagnose(summary)]
    summary.cannot_tell = cannot_tell(summary, meta)
    return summary


def cannot_tell(summary: Summary, meta: dict[str, Any]) -> list[str]:
    """What the rules could not judge and why: an empty findings list then means "not measured", never
    "no problem found"."""
    out = []
    if summary.data_wait_fraction is None:
        out.append(meta.get("step_split_unknown") or "cannot tell whether the loop waits for data: no per-step "
                   "timing was recorded (no optimizer step or DataLoader batch seen)")
    return out
