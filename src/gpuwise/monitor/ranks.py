"""DDP: one file per rank (the monitor writes `monitor-rank{RANK}.jsonl` into its out_dir), one merged report.

    # in train.py, every rank:   with gpuwise.monitor(out_dir="runs/mon") as mon: ...
    # afterwards, anywhere:      gpuwise.monitor.ranks.merged_summary("runs/mon", report="ddp.html")
"""

from __future__ import annotations

from ..errors import GpuwiseError
from .summary import summarize
from .timeline import Timeline, read_rank_files


def merge_rank_files(directory: str) -> Timeline:
    """Every rank's timeline from `directory`, merged (steps keep their rank)."""
    tl = read_rank_files(directory)
    if tl is None:
        raise GpuwiseError(f"no monitor-rank*.jsonl files in {directory!r}")
    return tl


def merged_summary(directory: str, report: str | None = None) -> dict:
    """The summary of all ranks (with per-rank rows and the rank_imbalance rule); optionally an HTML report."""
    tl = merge_rank_files(directory)
    summary = summarize(tl)
    if report:
        from ..report.html import write_html

        write_html(report, tl, summary, title="gpuwise monitor (all ranks)")
    return summary
