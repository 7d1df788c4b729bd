"""The files gpuwise's bootstrap (gpuwise/bootstrap) leaves behind, read back: one `Timeline` per process
that ran the hooks, merged over the processes that stepped an optimizer, and why there is none."""

from __future__ import annotations

import os

from .timeline import Timeline, merge_timelines, read_timeline


def _hook_file_names(folder: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(folder) if n.startswith("hooks-rank") and n.endswith(".jsonl"))
    except OSError:
        return []


def read_hook_files(folder: str, since_unix: float | None = None) -> tuple[Timeline | None, list[Timeline]]:
    """(the merged timeline of the processes that stepped an optimizer or None, every process's timeline);
    with `since_unix`, files of processes started before then (an earlier run's) are left out."""
    every = [read_timeline(os.path.join(folder, n)) for n in _hook_file_names(folder)]
    if since_unix is not None:
        every = [t for t in every if float(t.meta.get("t0_unix", since_unix)) >= since_unix]
    stepping = [t for t in every if t.steps]
    return (merge_timelines(stepping) if stepping else None), every


def hook_diagnosis(every: list[Timeline]) -> str | None:
    """Why no per-step split could be made ("cannot tell ..."), or None when some process had steps."""
    if any(t.steps for t in every):
        return None
    if not every:
        return ("cannot tell the per-step split: no Python process of the command imported torch with gpuwise's "
                "bootstrap (not a Python/PyTorch command, a Python that ignores PYTHONPATH or sitecustomize "
                "(python -S / -I), or it ended before importing torch)")
    batches = sum(int(t.meta.get("loader_batches") or 0) for t in every)
    if batches:
        wait = sum(float(t.meta.get("loader_wait_s") or 0.0) for t in every)
        return (f"cannot tell the per-step split: {batches} DataLoader batches were loaded but no torch.optim "
                "optimizer step was seen (a hand-written update, or an optimizer that does not subclass "
                "torch.optim.Optimizer)" + (f"; {wait:.1f} s waiting for batches" if wait else ""))
    return ("cannot tell the per-step split: torch was imported but neither a DataLoader batch nor an optimizer "
            "step was seen (inference only, or a loop that does not use torch.utils.data.DataLoader)")
