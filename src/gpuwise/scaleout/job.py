"""Running a gpuwise worker job (train or scale) under torchrun from the parent process.

The parent writes JOB.json in a temporary folder, launches `torchrun ... -m gpuwise.scaleout.worker
JOB.json` on the chosen devices, and reads the result file rank 0 wrote.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

from ..errors import GpuwiseError
from . import launch as launching
from .failure import summarize_failure

WORKER = ["--module", "gpuwise.scaleout.worker"]


@dataclass
class JobOutcome:
    exit_code: int
    result: dict | None
    plan: launching.LaunchPlan
    log_path: str | None = None     # the ranks' stderr, kept when the job failed
    failure: str | None = None      # one line: which rank failed and how (scaleout/failure.py)


def run_job(mode: str, config, *, nproc: int | None, max_restarts: int = 0, device: str = "auto",
            nnodes: int = 1, node_rank: int | None = None, rdzv_endpoint: str | None = None,
            rdzv_backend: str = "c10d", rdzv_id: str | None = None, min_free: int | str = 0,
            max_util: float | None = None, wait: float | str | None = None,
            extra_env: Mapping[str, str] | None = None,
            on_plan: Callable[[launching.LaunchPlan], None] | None = None) -> JobOutcome:
    """Launch `config` (a TrainConfig / ScaleConfig; its result_path is filled in) on `nproc` ranks."""
    with tempfile.TemporaryDirectory(prefix="gpuwise-scaleout-") as tmp:
        config.result_path = os.path.join(tmp, "result.json")
        job_path = os.path.join(tmp, "job.json")
        with open(job_path, "w") as fh:
            json.dump({"mode": mode, "config": asdict(config)}, fh)
        plan = launching.prepare(WORKER + [job_path], nproc_per_node=nproc, nnodes=nnodes, node_rank=node_rank,
                                 rdzv_endpoint=rdzv_endpoint, rdzv_backend=rdzv_backend, rdzv_id=rdzv_id,
                                 max_restarts=max_restarts, min_free=min_free, max_util=max_util, wait=wait,
                                 device=device, command=f"gpuwise {mode} {getattr(config, 'workload', '')}")
        if on_plan is not None:
            on_plan(plan)
        fd, log_path = tempfile.mkstemp(prefix=f"gpuwise-{mode}-", suffix=".log")  # kept when the job fails
        os.close(fd)
        code = launching.launch(plan, extra_env, stdout_to_stderr=True, log_path=log_path)
        result = None
        if os.path.exists(config.result_path):
            with open(config.result_path) as fh:
                result = json.load(fh)
        config.result_path = None
        failure = None
        if code != 0 or result is None:
            with open(log_path, errors="replace") as fh:
                failure = summarize_failure(fh.read())
        else:
            os.unlink(log_path)
            log_path = None
        return JobOutcome(code, result, plan, log_path, failure)


def require_result(outcome: JobOutcome, what: str) -> dict:
    """The result, or a GpuwiseError saying that the ranks failed (their errors are on stderr above)."""
    if outcome.exit_code != 0 or outcome.result is None:
        why = outcome.failure or f"torchrun exited with code {outcome.exit_code}"
        log = f"; the ranks' output: {outcome.log_path}" if outcome.log_path else ""
        raise GpuwiseError(f"{what} failed: {why}{log}; to survive a lost rank, save with --checkpoint-dir DIR "
                           "and let torchrun restart the ranks with --max-restarts N (they resume from the checkpoint)")
    return outcome.result
