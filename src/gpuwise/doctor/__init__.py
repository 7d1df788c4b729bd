"""`gpuwise doctor`: why PyTorch sees no GPU, or a slow one — each question a small check returning a
`Check` {name, status ok|warning|problem|skipped, evidence, fix}.

`gather()` looks at the machine once (environment, /dev, PCI, NVML or fake GPUs, PyTorch in a child
process); the checks are pure functions of those facts, run in the order CUDA needs things (build,
driver, library, device files, visibility, ordering, then each GPU's health).
"""

from __future__ import annotations

from . import (
    checks_gpu,  # noqa: F401  (registers the setup checks, then the per-GPU ones)
    torch_probe,
)
from .facts import Facts, gather
from .model import (
    CHECKS,
    EXIT_NO_GPU,
    EXIT_OK,
    EXIT_PROBLEM,
    OK,
    PROBLEM,
    SKIPPED,
    STATUSES,
    WARNING,
    Check,
    Options,
    Report,
)

__all__ = ["CHECKS", "EXIT_NO_GPU", "EXIT_OK", "EXIT_PROBLEM", "OK", "PROBLEM", "SKIPPED", "STATUSES", "WARNING",
           "Check", "Facts", "Options", "Report", "diagnose", "doctor", "gather"]


def diagnose(facts: Facts, options: Options = Options()) -> Report:
    """Run every registered check on `facts` (pure) and decide the exit code."""
    checks = [fn(facts, options) for fn in CHECKS.values()]
    usable = None if facts.torch is None else facts.torch.device_count > 0
    if options.expect_gpu and not usable:
        code = EXIT_NO_GPU
    elif any(c.status == PROBLEM for c in checks):
        code = EXIT_PROBLEM
    else:
        code = EXIT_OK
    return Report(checks, usable, code)


def doctor(*, expect_gpu: bool = False, max_temperature_c: float | None = None, probe_torch: bool = True) -> Report:
    """Look at this machine and check it: `gpuwise.doctor.doctor().checks`."""
    facts = gather(torch_probe=torch_probe.probe if probe_torch else None)
    return diagnose(facts, Options(expect_gpu=expect_gpu, max_temperature_c=max_temperature_c))
