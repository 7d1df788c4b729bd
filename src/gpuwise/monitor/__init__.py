"""Watch a training run and explain low or oscillating GPU utilisation (`gpuwise.monitor`, `gpuwise watch`).

    with gpuwise.monitor(report="run.html") as mon:
        for batch in mon.loader(loader):
            ...
    mon.summary()   # {"steps", "step_time_s": {"median"}, "data_wait_fraction", ..., "findings": [...]}

The modules of this package return data (a Timeline, the summary dict); the functions below, the public
face, are where `report=` turns them into the HTML report (gpuwise.report), as the CLI does.
"""

from __future__ import annotations

from .._callable import make_package_callable
from ..report.html import write_html
from ..report.monitor import render_summary
from .core import PHASES, Monitor
from .ranks import merge_rank_files, merged
from .result import Summary
from .rules import RULES, Finding, diagnose, rule, suggest_num_workers
from .summary import summarize, summary_of
from .timeline import ENV_DIR, Sample, StepRecord, Timeline, merge_timelines, read_rank_files, read_timeline

__all__ = ["ENV_DIR", "PHASES", "RULES", "Finding", "Monitor", "Sample", "Summary", "StepRecord", "Timeline", "diagnose",
           "merge_rank_files", "merge_timelines", "merged_summary", "monitor", "read_rank_files", "read_timeline", "rule", "suggest_num_workers",
           "show_run", "summarize", "summary_of"]


def monitor(device=None, report: str | None = None, **kwargs) -> Monitor:
    """`with gpuwise.monitor(device=None, report=None) as mon:` — see `Monitor` for the keyword arguments;
    `report="run.html"` writes the HTML report when the run ends."""
    on_stop = (lambda mon: write_html(report, mon.timeline, mon.summary())) if report else None
    return Monitor(device=device, on_stop=on_stop, **kwargs)


def merged_summary(directory: str, report: str | None = None) -> dict:
    """The summary of every rank's file in `directory` (per-rank rows, the rank_imbalance rule);
    `report=` also writes the HTML report."""
    timeline, summary = merged(directory)
    if report:
        write_html(report, timeline, summary, title="gpuwise monitor (all ranks)")
    return summary


def show_run(timeline: Timeline, summary: dict, *, report: str | None = None, title: str = "gpuwise monitor",
             print_summary: bool = False) -> None:
    """What a finished run shows: the HTML report at `report`, the summary on the terminal."""
    if report:
        write_html(report, timeline, summary, title=title)
    if print_summary:
        render_summary(summary, report_path=report)


make_package_callable(__name__, monitor)  # see gpuwise/_callable.py
