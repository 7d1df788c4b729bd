"""Tune: search batch size, DataLoader settings and precision by measurement (plan seeds, measure confirms)."""

from .tuner import TuneResult, tune

__all__ = ["TuneResult", "tune"]
