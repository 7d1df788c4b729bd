"""The published-measurement corpus: load, check and convert the rows of `benchmarks/published/*.jsonl`.

One JSONL file per source, one row per line (the format is in README.md next to this file). Used by
`benchmarks/published_memory.py` (memory rows), the throughput runner and tests/test_published_corpus.py:

    from corpus import load_rows            # with benchmarks/published on sys.path
    rows = load_rows()                      # every row of every source, checked
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

# Bytes per unit: GB is decimal (1e9, what litgpt and most tables print: `max_memory_allocated() / 1e9`),
# GiB binary (2**30, PyTorch's memory_summary and nvidia-smi's "MiB").
UNIT_BYTES = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}

# What each memory metric measures, and the number of gpuwise's estimate that predicts it.
MEMORY_METRICS = {
    "max_allocated": "peak_allocated_bytes",   # torch.cuda.max_memory_allocated()
    "active": "peak_allocated_bytes",          # memory_stats()["active_bytes.all.peak"] (= allocated, no streams)
    "max_reserved": "peak_reserved_bytes",     # torch.cuda.max_memory_reserved()
    "nvidia_smi": "device_used_bytes",         # nvidia-smi / NVML used: reserved + CUDA context + workspaces
    "oom": "peak_reserved_bytes",              # published out-of-memory: the reserved peak must exceed the GPU
}
THROUGHPUT_METRICS = {"tokens_per_s_per_gpu", "tokens_per_s", "samples_per_s", "iter_per_s", "s_per_iter",
                      "mfu_pct", "time_per_1k_iter_s"}
METHODS = {"full", "lora", "qlora", "adapter", "inference", "dora"}
CHECKPOINTING = {"none", "full", "selective"}
SHARDING = {"none", "ddp", "fsdp", "fsdp2", "zero1", "zero2", "zero3", "tp", "pp", "hsdp"}
ROW_KEYS = {"id", "source", "quote", "setting", "metric", "value", "unit", "gpuwise_args", "why_not"}
SETTING_KEYS = {"model", "workload", "code", "method", "micro_batch", "grad_accum", "seq_len", "variable_length",
                "precision", "base_dtype", "optimizer", "checkpointing", "lora", "gpus", "sharding", "gpu", "attn",
                "transformers_version"}


def load_rows(folder: Path | str = HERE, check: bool = True) -> list[dict]:
    """Every row of every `<source>.jsonl` in `folder`, in file then line order; each gets `_file`."""
    rows: list[dict] = []
    for path in sorted(Path(folder).glob("*.jsonl")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path.name}:{n}: not JSON ({exc})") from None
            row["_file"] = f"{path.name}:{n}"
            rows.append(row)
    if check:
        problems = [p for row in rows for p in check_row(row)]
        ids = [r.get("id") for r in rows]
        problems += [f"id {i!r} appears {ids.count(i)} times" for i in sorted({i for i in ids if ids.count(i) > 1})]
        if problems:
            raise ValueError("published corpus:\n  " + "\n  ".join(problems))
    return rows


def check_row(row: dict) -> list[str]:
    """What is wrong with one row (empty when nothing)."""
    where = f"{row.get('_file', '?')} {row.get('id', '?')}"
    out = [f"{where}: missing {k}" for k in sorted(ROW_KEYS - row.keys())]
    setting = row.get("setting") or {}
    out += [f"{where}: setting misses {k}" for k in sorted(SETTING_KEYS - setting.keys())]
    src = row.get("source") or {}
    if "name" not in src or not ({"repo", "path"} <= src.keys() or "paper" in src or "url" in src):
        out.append(f"{where}: source needs name and repo+path, paper or url")
    if not row.get("quote"):
        out.append(f"{where}: empty quote")
    metric = row.get("metric")
    if metric not in MEMORY_METRICS and metric not in THROUGHPUT_METRICS:
        out.append(f"{where}: unknown metric {metric!r}")
    if metric in MEMORY_METRICS and metric != "oom" and row.get("unit") not in UNIT_BYTES:
        out.append(f"{where}: memory unit {row.get('unit')!r} not one of {sorted(UNIT_BYTES)}")
    if metric != "oom" and not isinstance(row.get("value"), (int, float)):
        out.append(f"{where}: value must be a number")
    if setting.get("method") not in METHODS:
        out.append(f"{where}: method {setting.get('method')!r} not in {sorted(METHODS)}")
    if setting.get("checkpointing") not in CHECKPOINTING:
        out.append(f"{where}: checkpointing {setting.get('checkpointing')!r} not in {sorted(CHECKPOINTING)}")
    if setting.get("sharding") not in SHARDING:
        out.append(f"{where}: sharding {setting.get('sharding')!r} not in {sorted(SHARDING)}")
    args = row.get("gpuwise_args")
    if args is None and not row.get("why_not"):
        out.append(f"{where}: not expressible (gpuwise_args null) needs why_not")
    if args is not None and not (isinstance(args, list) and all(isinstance(a, str) for a in args)):
        out.append(f"{where}: gpuwise_args must be a list of strings or null")
    return out


def is_memory(row: dict) -> bool:
    return row["metric"] in MEMORY_METRICS


def expressible(row: dict) -> bool:
    return row.get("gpuwise_args") is not None


def published_bytes(row: dict) -> float | None:
    """The published memory number in bytes (None for an OOM row)."""
    if row["metric"] == "oom":
        return None
    return float(row["value"]) * UNIT_BYTES[row["unit"]]


def workload_path(row: dict) -> str:
    """The workload as gpuwise takes it: paths in the corpus are relative to the repository root."""
    w = row["setting"]["workload"]
    if ":" in w.split("/")[0] or w.startswith("/"):
        return w
    return str(ROOT / w)
