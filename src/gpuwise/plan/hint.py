"""Ask the planner one question on behalf of another tool: the largest batch on a GPU, or why it cannot say.

`tune` seeds its batch search with the answer and `watch` names it in the low-memory-use finding. Both
work without it, so a planner that cannot tell (an unknown GPU, a workload it cannot trace, a failure of
its own) is an answer with the reason, not an error of the tool that asked.
"""

from __future__ import annotations

from dataclasses import dataclass

from .estimate import estimate


@dataclass(frozen=True)
class MaxBatchAnswer:
    max_batch_size: int | None  # None: the planner could not say; `why_not` tells why
    why_not: str | None = None


def ask_max_batch(workload, batch_size: int, gpu: str | None, *, precision: str = "fp32",
                  optimizer: str | None = None) -> MaxBatchAnswer:
    """The planner's largest batch of `workload` on `gpu` (target cuda), asked at `batch_size`."""
    try:
        est = estimate(workload, batch_size, optimizer=optimizer, precision=precision, target="cuda", gpu=gpu)
    except Exception as exc:  # noqa: BLE001 - the asker works without an answer; the reason goes with it
        return MaxBatchAnswer(None, type(exc).__name__)
    value = est.max_batch_size
    return MaxBatchAnswer(int(value), None) if isinstance(value, int) and value else MaxBatchAnswer(None, "no max batch")


def planner_max_batch(workload, batch_size: int, gpu: str, precision: str = "fp32") -> int | None:
    """`ask_max_batch`'s number alone (the monitor summary's `planner` argument)."""
    return ask_max_batch(workload, batch_size, gpu, precision=precision).max_batch_size
