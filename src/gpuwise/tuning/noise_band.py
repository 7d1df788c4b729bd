"""Decisions beyond noise: a trial's samples/s with its spread, and when one setting really beats another.

A trial's steady steps are cut into `BLOCKS` consecutive blocks; each block's rate (its samples over its wall
time) is one reading, and the trial's band is the 95% Student-t interval of the readings' mean. Blocks, not
single steps: consecutive steps are correlated (a worker's batch arrives late, the next one early), blocks of
several steps are much less so. That band misses what changes between runs (the other processes on the
machine, a worker that starts slowly), so a winner is also re-measured back to back with the script as
written (`tuning/script.py`): it must win outside the bands in every re-measured pair.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

BLOCKS = 5
GAIN = 1.05   # and at least 5% more samples/s: a smaller gain is not worth a change to the script
# two-sided 95% Student-t quantiles by degrees of freedom (scipy.stats.t.ppf(0.975, df))
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


@dataclass(frozen=True)
class Band:
    mean: float   # samples/s over all the blocks' time
    low: float
    high: float
    blocks: int

    @property
    def rel(self) -> float:
        """Half-width over the mean."""
        return (self.high - self.low) / 2 / self.mean if self.mean else math.inf


def band(samples: Sequence[float], seconds: Sequence[float], blocks: int = BLOCKS) -> Band | None:
    """The rate of steps (samples and wall seconds each) with its 95% band, from `blocks` consecutive blocks
    (fewer when there are fewer than 2 steps a block); None with fewer than 2 steps."""
    n = len(samples)
    if n < 2 or sum(seconds) <= 0:
        return None
    k = max(2, min(blocks, n // 2))
    edges = [round(i * n / k) for i in range(k + 1)]
    rates = []
    for lo, hi in zip(edges, edges[1:]):
        t = sum(seconds[lo:hi])
        if t > 0:
            rates.append(sum(samples[lo:hi]) / t)
    mean = sum(samples) / sum(seconds)
    if len(rates) < 2:
        return Band(mean, 0.0, math.inf, len(rates))
    m = sum(rates) / len(rates)
    sd = math.sqrt(sum((r - m) ** 2 for r in rates) / (len(rates) - 1))
    half = T95.get(len(rates) - 1, 1.96) * sd / math.sqrt(len(rates))
    return Band(mean, max(mean - half, 0.0), mean + half, len(rates))


def beats(candidate: Band | None, baseline: Band | None, gain: float = GAIN) -> bool:
    """Whether `candidate` is faster than `baseline` beyond both bands (its low end above the baseline's high
    end) and by at least `gain`."""
    if candidate is None or baseline is None:
        return False
    return candidate.low > baseline.high and candidate.mean >= gain * baseline.mean
