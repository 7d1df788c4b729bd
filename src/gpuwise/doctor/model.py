"""The doctor's result types: one `Check` per question, a registry of check functions, the exit codes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

OK, WARNING, PROBLEM, SKIPPED = "ok", "warning", "problem", "skipped"
STATUSES = (OK, WARNING, PROBLEM, SKIPPED)

# Exit codes of `gpuwise doctor` (2 stays "bad input", 1 "internal error", as for every command).
EXIT_OK = 0          # nothing is wrong (warnings allowed): fine for a CPU job, and for a GPU job if GPUs are seen
EXIT_PROBLEM = 3     # at least one check found a problem
EXIT_NO_GPU = 4      # --expect-gpu and PyTorch cannot use any GPU (takes precedence over 3)


@dataclass(frozen=True)
class Check:
    """One verdict. `status`: ok | warning | problem | skipped (not applicable, or the facts it needs were
    not reported: `evidence` says which). `fix` is a concrete change, empty when there is nothing to do."""

    name: str
    status: str
    evidence: str
    fix: str = ""
    details: dict[str, Any] = field(default_factory=dict)  # structured extras (the device mapping table)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    def to_dict(self) -> dict:
        d = {"name": self.name, "status": self.status, "evidence": self.evidence, "fix": self.fix}
        if self.details:
            d["details"] = self.details
        return d


@dataclass(frozen=True)
class Options:
    expect_gpu: bool = False
    max_temperature_c: float | None = None  # the user's own limit ("keep the card under 80 °C")


@dataclass(frozen=True)
class Report:
    checks: list[Check]
    gpu_usable: bool | None  # PyTorch sees at least one GPU; None when PyTorch was not probed
    exit_code: int

    def to_dict(self) -> dict:
        return {"checks": [c.to_dict() for c in self.checks], "gpu_usable": self.gpu_usable, "exit_code": self.exit_code}


CHECKS: dict[str, Callable] = {}


def check(name: str):
    """Register `fn(facts, options) -> Check` under `name` (run in registration order)."""
    def deco(fn):
        CHECKS[name] = fn
        return fn
    return deco
