"""Shared terminal output: stdout for results, stderr for progress and messages."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from rich.console import Console

from ..contracts import SCHEMA_VERSION

# Piped output (files, CI logs) gets a wide page instead of rich's 80 columns, so tables are not cut.
_PIPE_WIDTH = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 150
out = Console(highlight=False, soft_wrap=True, width=_PIPE_WIDTH)
err = Console(stderr=True, highlight=False)


def emit_json(obj: dict[str, Any]) -> None:
    """Exactly one JSON object on stdout (the --json contract), `schema_version` first (docs/contracts.md)."""
    sys.stdout.write(json.dumps({"schema_version": SCHEMA_VERSION, **obj}, default=_default) + "\n")
    sys.stdout.flush()


def _default(obj: Any):
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    return str(obj)


def progress(**kwargs):
    """A progress bar on stderr (transient), for anything that takes more than a few seconds."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err, transient=True, **kwargs)
