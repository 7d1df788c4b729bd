"""Results written as they come: one JSON object per line, appended so that a crash never loses or
corrupts what was already measured (tune trials, truth records)."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from .errors import GpuwiseError


def read_json_file(path: str, label: str, error: type[GpuwiseError] = GpuwiseError) -> Any:
    """A whole JSON file a user pointed at (`label` names where it came from, e.g. `ENV=path`): an unreadable
    file or bad JSON is one line, raised as `error`."""
    try:
        with open(path) as fh:
            return json.load(fh)
    except OSError as exc:
        raise error(f"{label}: cannot read the file ({exc.strerror})") from exc
    except json.JSONDecodeError as exc:
        raise error(f"{label}: not valid JSON (line {exc.lineno}: {exc.msg})") from exc


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
    """Every complete JSON object in the file, in order; [] if absent. A torn last line (a crash while
    appending) is skipped quietly; a corrupt line before good ones is skipped with a warning (logger
    "gpuwise", shown on stderr) and every good record is kept; a file with no JSON object at all (random
    bytes, another format) is a GpuwiseError rather than an empty history that would be appended to."""
    if not os.path.exists(path):
        return []
    with open(path, "rb") as fh:
        lines = fh.read().split(b"\n")
    records, bad = [], []
    numbered = [(i + 1, raw) for i, raw in enumerate(lines) if raw.strip()]
    for number, raw in numbered:
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            obj = None
        if isinstance(obj, dict):
            records.append(obj)
        else:
            bad.append(number)
    if bad and not records:
        raise GpuwiseError(f"{os.fspath(path)!r} is not a gpuwise results file (none of its {len(numbered)} lines "
                           "is a JSON object): move it away or give another file")
    last = numbered[-1][0] if numbered else 0
    middle = [n for n in bad if n != last]
    if middle:
        shown = ", ".join(map(str, middle[:5])) + (", ..." if len(middle) > 5 else "")
        logging.getLogger("gpuwise").warning(
            f"gpuwise: warning: {os.fspath(path)}: skipped {len(middle)} corrupt line(s) (line {shown}); "
            f"kept {len(records)} good records")
    return records
