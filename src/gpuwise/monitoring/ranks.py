"""DDP: one file per rank (the monitor writes `monitor-rank{RANK}.jsonl` into its out_dir), one merged summary.

    # in train.py, every rank:   with gpuwise.monitor(out_dir="runs/mon") as mon: ...
    # afterwards, anywhere:      gpuwise.merged_summary("runs/mon", report="ddp.html")
"""

from __future__ import annotations

from ..errors import GpuwiseError
from ..plan.hint import planner_max_batch
from .summary import summarize
from .timeline import Timeline, read_rank_files


def merge_rank_files(directory: str) -> Timeline:
    """Every rank's timeline from `directory`, merged (steps keep their rank)."""
    tl = read_rank_files(directory)
    if tl is None:
        raise GpuwiseError(f"no monitor-rank*.jsonl files in {directory!r}")
    return tl


def merged(directory: str) -> tuple[Timeline, dict]:
    """All ranks' timeline and its summary (with per-rank rows and the rank_imbalance rule)."""
    tl = merge_rank_files(directory)
    return tl, summarize(tl, planner=planner_max_batch)
