"""The estimate against a GPU truth record (docs/contracts.md contract; read by gpuwise/truth.py): the record's
step recomputed on the CPU for its GPU, and the signed errors of every predicted number against the measured ones
(benchmarks/truth_errors.py, benchmarks/truth_speed.py, tests/test_plan_truth.py)."""

from __future__ import annotations

from typing import Any

from ..step import OPTIMIZERS
from ..truth import record_workload, versions_differ
from .estimate import estimate
from .speed.attention import gpu_torch


def truth_errors(record: dict[str, Any]) -> dict[str, Any]:
    """Recompute `record`'s estimate (target cuda, its GPU) and return signed errors in percent of the truth."""
    optimizer = record.get("optimizer")
    with gpu_torch(record.get("torch")):  # the record's torch decides the attention kernel (speed/attention.py)
        est = estimate(record_workload(record), int(record["batch_size"]),
                       optimizer=optimizer if optimizer in OPTIMIZERS else None,
                       precision=record.get("precision", "fp32"), checkpointing=bool(record.get("checkpointing")),
                       target="cuda", gpu=record.get("gpu_name"), search_max_batch=False)

    def err_against(predicted: float | None, truth: float | None) -> float | None:
        return round(100 * (predicted - truth) / truth, 3) if truth and predicted is not None else None

    def err(key: str) -> float | None:
        return err_against(getattr(est, key), record.get(key))

    return {"source": record.get("_source", ""), "kind": record.get("kind", "measure"),
            "workload": record["workload"], "batch_size": record["batch_size"],
            "optimizer": optimizer, "precision": record.get("precision"), "oom": bool(record.get("oom")),
            "predicted_fits": est.fits,
            "peak_allocated_err_pct": err("peak_allocated_bytes"), "peak_reserved_err_pct": err("peak_reserved_bytes"),
            "device_used_err_pct": err("device_used_bytes"), "estimate_s": est.seconds,
            # the roofline's step time (a lower bound: peak FLOP/s and bandwidth) against the measured median
            "roofline_step_s": est.roofline.time_s if est.roofline else None,
            "measured_step_s": record.get("step_time_s"),
            # the speed model's step time (plan/speed/) and what bounds it
            "predicted_step_s": est.speed.step_time_s if est.speed else None,
            "step_err_pct": err_against(est.speed.step_time_s if est.speed else None, record.get("step_time_s")),
            "bound_by": est.speed.bound_by if est.speed else None,
            "breakdown_s": est.speed.breakdown if est.speed else None,
            # the model's own libraries at other versions here than measured: possibly another program
            "versions_differ": versions_differ(record)}
