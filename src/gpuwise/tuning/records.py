"""Typed values of a tune: the options it runs with, one trial, and a chosen set of settings.

Their `to_dict()` forms are the JSON of docs/contracts.md's `gpuwise tune --json` contract (`best`, `baseline`,
`trials[]`) and the lines of the results file, key for key and in the same order as before they were typed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .search import MIN_GAIN


@dataclass(frozen=True)
class Settings:
    """The settings a training run is given, and the samples/s measured with them (`best`, `baseline`)."""

    batch_size: int
    num_workers: int = 0
    pin_memory: bool = False
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    precision: str = "fp32"
    samples_per_s: float | None = None
    num_threads: int | None = None  # CPU device: the step's intra-op threads next to the workers

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["num_threads"] is None:
            del d["num_threads"]
        return d


@dataclass(frozen=True)
class Trial:
    """One trial: what defines it (the results file's key, see store.KEY_FIELDS) and what it measured."""

    workload: str
    device: str
    kind: str                        # "train" | "compute" | "fit" | "loader" (trials.KINDS)
    batch_size: int
    precision: str | None = None
    optimizer: str | None = None
    num_workers: int | None = None
    pin_memory: bool | None = None
    prefetch_factor: int | None = None
    persistent_workers: bool | None = None
    measure_s: float = 0.0
    status: str = ""                 # the child's status: ok, oom, error, timeout
    oom: bool = False
    samples_per_s: float | None = None
    seconds: float = 0.0
    steps: int | None = None
    startup_s: float | None = None
    num_threads: int | None = None
    peak_memory_bytes: int | None = None
    memory_kind: str | None = None
    error: str | None = None
    resumed: bool = False            # read back from the results file instead of run

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def rate(self) -> float | None:
        """samples/s when the trial ran to the end, else None."""
        return self.samples_per_s if self.ok else None

    def settings(self) -> Settings:
        """The settings of an end-to-end ("train") trial, with its samples/s."""
        return Settings(self.batch_size, self.num_workers, self.pin_memory, self.prefetch_factor,
                        self.persistent_workers, self.precision, self.samples_per_s)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_record(self) -> dict[str, Any]:
        """The results file's line (`resumed` is a property of this run, not of the trial)."""
        d = asdict(self)
        del d["resumed"]
        return d

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Trial:
        """A results-file line (older files may lack fields or carry others)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in record.items() if k in known})


@dataclass(frozen=True)
class TuneOptions:
    """How a tune runs (`gpuwise.tune`'s keyword arguments; see its docstring)."""

    budget_s: float = 300
    results: str | None = None
    batch_sizes: list[int] | None = None
    batch_size: int | None = None
    precision: str = "fp32"
    precisions: list[str] | None = None
    optimizer: str | None = None
    measure_s: float = 2.0
    max_workers: int | None = None
    max_trials: int | None = None
    min_gain: float = MIN_GAIN
    on_trial: Callable[[Trial, float], None] | None = field(default=None, compare=False)
