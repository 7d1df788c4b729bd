"""Watch a training run and explain low or oscillating GPU utilisation (`gpuwise.monitor`, `gpuwise watch`).

    with gpuwise.monitor(report="run.html") as mon:
        for batch in mon.loader(loader):
            ...
    mon.summary()   # {"steps", "step_time_s": {"median"}, "data_wait_fraction", ..., "findings": [...]}
"""

from .._callable import make_package_callable
from .core import PHASES, Monitor, monitor
from .ranks import merge_rank_files, merged_summary
from .rules import RULES, Finding, diagnose, rule, suggest_num_workers
from .summary import summarize
from .timeline import ENV_DIR, Sample, StepRecord, Timeline, merge_timelines, read_rank_files, read_timeline

__all__ = ["ENV_DIR", "PHASES", "RULES", "Finding", "Monitor", "Sample", "StepRecord", "Timeline", "diagnose",
           "merge_rank_files", "merge_timelines", "merged_summary", "monitor", "read_rank_files", "read_timeline", "rule", "suggest_num_workers",
           "summarize"]


make_package_callable(__name__, monitor)  # see gpuwise/_callable.py
