"""The trial store: one JSON line per finished trial, appended atomically, read back to resume.

Each record carries the settings that define the trial (`key_of`); a rerun of `tune` with the same
results file finds a finished trial by that key and reuses it instead of running it again, so a killed
tune resumes where it stopped. A line is written with one `write` of the full line, then flushed and
fsynced, so a kill leaves either the whole line or nothing (a torn last line is ignored on reading).
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..errors import GpuwiseError
from ..jsonl import append_line, read_lines

# the fields that make two trials the same trial
KEY_FIELDS = ("workload", "device", "kind", "batch_size", "precision", "optimizer", "num_workers", "pin_memory",
              "prefetch_factor", "persistent_workers", "measure_s")
# statuses worth reusing on a rerun (an error, a timeout or a killed trial is tried again)
REUSABLE = ("ok", "oom")


def key_of(record: dict[str, Any]) -> str:
    return json.dumps({k: record.get(k) for k in KEY_FIELDS}, sort_keys=True)


class TrialStore:
    """Finished trials by key, backed by an optional JSONL file."""

    def __init__(self, path: str | None = None):
        self.path = path
        self._by_key: dict[str, dict[str, Any]] = {}
        self.loaded = 0
        if path:
            _check_writable(path)
        if path and os.path.exists(path):
            for record in read_lines(path):
                if record.get("status") in REUSABLE:
                    self._by_key[key_of(record)] = record
            self.loaded = len(self._by_key)

    def get(self, settings: dict[str, Any]) -> dict[str, Any] | None:
        return self._by_key.get(key_of(settings))

    def add(self, record: dict[str, Any]) -> None:
        if record.get("status") in REUSABLE:
            self._by_key[key_of(record)] = record
        if self.path:
            append_line(self.path, record)


def _check_writable(path: str) -> None:
    """Fail before the first trial, in one line, when the results file cannot be appended to (a folder,
    a missing or read-only directory) rather than after spending a trial's time."""
    if os.path.isdir(path):
        raise GpuwiseError(f"results file {path!r} is a folder: give a file name (JSON lines)")
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "a"):
            pass
    except OSError as exc:
        raise GpuwiseError(f"cannot write the results file {path!r}: {exc.strerror or exc}") from None
