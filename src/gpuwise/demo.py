"""The demo pipeline as a library function returning plain data (the CLI renders it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .devices import discover
from .devices.select import pick
from .errors import GpuwiseError
from .measuring import measure as measure_step
from .plan import estimate
from .workload import load_workload


def run_demo(spec: str, batch_size: int, *, gpu: str | None = "H100", steps: int = 3, measure: bool = True,
             on_stage: Callable[[str], None] | None = None) -> dict[str, Any]:
    stage = on_stage or (lambda s: None)
    result: dict[str, Any] = {"workload": spec, "batch_size": batch_size}
    wl = load_workload(spec)  # first, so a bad workload is one line before any progress output
    model = wl.build_model()
    wl.build_batch(min(batch_size, 2))
    result["parameters"] = sum(p.numel() for p in model.parameters())
    del model

    stage("devices")
    found = discover()
    result["devices"] = {"backend": found.backend, "reason": found.reason, "gpus": [g.to_dict() for g in found.gpus]}
    device = "cpu"
    if found.gpus:
        try:
            # reserved for this process's life; CUDA_VISIBLE_DEVICES is inherited by the measuring child
            result["picked"] = pick(1).to_dict()
            device = "cuda"
        except GpuwiseError as exc:
            result["picked"] = {"error": str(exc)}
    result["device"] = device

    stage("plan")
    result["plan"] = estimate(wl, batch_size, target=device).to_dict()
    if gpu:
        result["plan_gpu"] = estimate(wl, batch_size, target="cuda", gpu=gpu).to_dict()

    if measure:
        stage(f"measure ({steps} steps on {device})")
        result["measure"] = measure_step(wl.spec, batch_size, steps=steps, device=device).to_dict()
    return result
