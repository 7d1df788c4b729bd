"""Results written as they come: one JSON object per line, appended so that a crash never loses or
corrupts what was already measured (tune trials, truth records)."""

from __future__ import annotations

import json
import os
from typing import Any


def append_line(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Append one complete line with a single write() on an O_APPEND descriptor, then fsync: a crash
    leaves either the whole record or (at worst) a torn last line that `read_lines` skips."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    data = (json.dumps(record) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data  # after a torn last line: start a new line, or this record is lost with it
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_lines(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every complete JSON object in the file, in order; a torn or foreign line is skipped. [] if absent."""
    if not os.path.exists(path):
        return []
    records = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                records.append(obj)
    return records
