"""gpuwise inside users' own training code: `gpuwise.monitor(...)`, `gpuwise.merged_summary(...)`, and the
callbacks for Lightning (`gpuwise.integrations.lightning`) and the HF Trainer (`gpuwise.integrations.hf`).

    with gpuwise.monitor(report="run.html") as mon:
        for batch in mon.loader(loader):
            ...

Like the CLI, this is a front end: it takes the monitor's data (gpuwise.monitoring) and renders it where
asked (`report=` writes the HTML report, gpuwise.report).
"""

from __future__ import annotations

from ..monitoring import Monitor, Timeline, merged
from ..report.html import write_html
from ..report.monitor import render_summary

__all__ = ["merged_summary", "monitor", "show_run"]


class CallbackRun:
    """What both training-framework callbacks keep: the settings they were made with and the run in hand."""

    def _keep(self, report: str | None, out_dir: str | None, interval_s: float, print_summary: bool) -> None:
        self.report = report
        self.out_dir = out_dir
        self.interval_s = interval_s
        self.print_summary = print_summary
        self.monitor: Monitor | None = None
        self.result: dict | None = None
        self._last_end: float | None = None


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
