"""gpuwise: make a PyTorch training job use GPUs well — pick, plan, measure, tune, watch, scale.

The public functions are imported lazily so that `import gpuwise` stays cheap and never initialises
CUDA (important for `pick`, which must set CUDA_VISIBLE_DEVICES first).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "pick": "gpuwise.devices", "try_gpu": "gpuwise.devices", "try_all_gpus": "gpuwise.devices",
    "list_gpus": "gpuwise.devices", "discover": "gpuwise.devices",
    "load_workload": "gpuwise.workload", "Workload": "gpuwise.workload",
    "TrainStep": "gpuwise.step", "StepConfig": "gpuwise.step",
    "estimate": "gpuwise.plan", "fit": "gpuwise.plan.fit", "estimate_inference": "gpuwise.plan.inference", "measure": "gpuwise.measuring", "tune": "gpuwise.tuning",
    "monitor": "gpuwise.integrations", "merged_summary": "gpuwise.integrations",
    "GpuwiseError": "gpuwise.errors",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gpuwise' has no attribute {name!r}")
