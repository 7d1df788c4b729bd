"""Measure: real steps on a device in an isolated child process (OOM-safe).

`measure(workload, batch_size, ...) -> Measurement` runs warm-up + steady steps in a spawned child;
`find_max_batch(workload, ...) -> MaxBatchResult` finds the largest batch that runs by isolated trials.
"""

from __future__ import annotations

from .api import Measurement, measure
from .maxbatch import MaxBatchResult, find_max_batch, next_candidate

__all__ = ["Measurement", "measure", "MaxBatchResult", "find_max_batch", "next_candidate"]

