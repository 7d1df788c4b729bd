"""Tune: search batch size, DataLoader settings and precision by measurement (plan seeds, measure confirms).

`gpuwise.tune(...)` is `tune` below (the package is named `tuning` so that importing it never rebinds the
public name `gpuwise.tune`).
"""

from .tuner import TuneResult, tune

__all__ = ["TuneResult", "tune"]

