"""GPU truth records (docs/contracts.md contract), in one place: their fields, one record from a measurement,
appending one, and reading a folder of them back.

A record is one JSON object per line of `benchmarks/truth/<gpu-slug>.jsonl` (the slug:
`gpuwise.plan.catalog.gpu_slug`). `gpuwise.measure` makes the values, benchmarks/truth/collect.py writes
the corpus, and `gpuwise.plan.against_truth.truth_errors` judges the planner against it. Workload paths in
records are relative to the repository that holds them: the reader is told that root, it does not guess it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .jsonl import append_line

# the contract's fields, in order
TRUTH_FIELDS = ("workload", "batch_size", "optimizer", "precision", "checkpointing", "gpu_name", "torch", "cuda",
                "driver", "peak_allocated_bytes", "peak_reserved_bytes", "device_used_bytes", "step_time_s", "oom")


def truth_record(values: Mapping[str, Any]) -> dict[str, Any]:
    """The contract's fields of `values` (a measurement's dict, with its environment), in order."""
    record = {k: values.get(k) for k in TRUTH_FIELDS}
    record["oom"] = bool(record["oom"])
    return record


def append_record(path: str | os.PathLike, record: Mapping[str, Any]) -> None:
    """Append one record (contract fields, then any extras) as one crash-safe line."""
    append_line(path, dict(record))


def read_records(folder: str | os.PathLike, root: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """Every record of every `*.jsonl` in `folder` ([] when there is none), each with `_source`
    ("file:line") and, given the repository `root` its workload paths are relative to, `_root`.
    A line that is not JSON (cut by a crash of the collector) is skipped."""
    records = []
    for path in sorted(Path(folder).glob("*.jsonl")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            try:
                record = json.loads(line) if line.strip() else None
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                record.setdefault("_source", f"{path.name}:{n}")
                if root is not None:
                    record.setdefault("_root", str(root))
                records.append(record)
    return records


def record_workload(record: Mapping[str, Any]) -> str:
    """The record's workload spec, a `.py` path resolved against its `_root` when it is not found as given."""
    spec = record["workload"]
    if spec.endswith(".py") and not Path(spec).exists() and record.get("_root"):
        candidate = Path(record["_root"]) / spec
        if candidate.exists():
            return str(candidate)
    return spec


# libraries whose code is the model a record ran: their versions are kept in records (collect.py) and a
# recompute under another version traces another program where that code changed
MODEL_LIBRARIES = ("transformers", "peft", "timm")


def versions_differ(record: Mapping[str, Any]) -> dict[str, dict[str, str | None]]:
    """{library: {"measured": version, "traced": version here}} for each model library whose version the record
    names and this environment differs from (None here: not installed); {} when all agree or none is named."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, dict[str, str | None]] = {}
    for lib in MODEL_LIBRARIES:
        measured = record.get(lib)
        if not measured:
            continue
        try:
            here: str | None = version(lib)
        except PackageNotFoundError:
            here = None
        if here != measured:
            out[lib] = {"measured": measured, "traced": here}
    return out
