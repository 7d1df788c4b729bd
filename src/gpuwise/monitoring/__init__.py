"""Watch a training run and explain low or oscillating GPU utilisation: the data behind `gpuwise.monitor`
and `gpuwise watch`.

    mon = Monitor(device)            # gpuwise.monitor(...) in users' code (gpuwise.integrations)
    with mon:
        for batch in mon.loader(loader):
            ...
    mon.summary()   # {"steps", "step_time_s": {"median"}, "data_wait_fraction", ..., "findings": [...]}

The modules of this package return data (a Timeline, the summary dict); rendering it (the HTML report,
the terminal) is gpuwise.report's, reached from the CLI and from gpuwise.integrations.
"""

from __future__ import annotations

from .core import PHASES, Monitor
from .ranks import merge_rank_files, merged
from .result import Summary
from .rules import RULES, Finding, diagnose, rule, suggest_num_workers
from .summary import summarize, summary_of
from .timeline import ENV_DIR, Sample, StepRecord, Timeline, merge_timelines, read_rank_files, read_timeline

__all__ = ["ENV_DIR", "PHASES", "RULES", "Finding", "Monitor", "Sample", "Summary", "StepRecord", "Timeline", "diagnose",
           "merge_rank_files", "merge_timelines", "merged", "read_rank_files", "read_timeline", "rule", "suggest_num_workers",
           "summarize", "summary_of"]
