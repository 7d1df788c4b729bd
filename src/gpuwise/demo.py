"""The demo pipeline as a library function returning plain data (the CLI renders it)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from .devices import discover
from .devices.select import pick
from .errors import GpuwiseError
from .workload import load_workload


def _optional(module: str, name: str):
    """A pipeline stage that may not be installed in this build: (function or None)."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


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
            chosen = pick(1, set_env=False)
            device = "cuda"  # the child process sees only the chosen GPU
            result["picked"] = chosen.to_dict()
        except GpuwiseError as exc:
            result["picked"] = {"error": str(exc)}
    result["device"] = device

    estimate = _optional("gpuwise.plan", "estimate")
    if estimate is not None:
        stage("plan")
        target = "cuda" if device == "cuda" else "cpu"
        result["plan"] = estimate(wl, batch_size, target=target).to_dict()
        if gpu:
            result["plan_gpu"] = estimate(wl, batch_size, target="cuda", gpu=gpu).to_dict()

    measure_fn = _optional("gpuwise.measure", "measure")
    if measure and measure_fn is not None:
        stage(f"measure ({steps} steps on {device})")
        env_device = device
        if device == "cuda" and "picked" in result and "cuda_visible_devices" in result["picked"]:
            import os

            os.environ.update({"CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                               "CUDA_VISIBLE_DEVICES": result["picked"]["cuda_visible_devices"]})
        result["measure"] = measure_fn(wl.spec, batch_size, steps=steps, device=env_device).to_dict()
    return result
