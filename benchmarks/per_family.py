"""The loop benchmarks/optimizer_swap.py and units_rebuild.py share: one child process per model family (the
script itself with `--one TYPE`, which prints the family's row as its last line of JSON), rows appended to a
.jsonl as they come (a rerun resumes: recorded families are skipped), a child that fails or runs over its limit
a row of its own (`failed(type, why)`)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path


def rows_by_child(script: str, types: list[str], jsonl: Path, limit_s: float, cwd: Path,
                  failed: Callable[[str, str], dict]) -> dict[str, dict]:
    """Every recorded row and every one run now for `types`, by family."""
    done = {json.loads(line)["type"]: json.loads(line) for line in jsonl.read_text().splitlines()} \
        if jsonl.exists() else {}
    name = Path(script).stem
    for t in types:
        if t in done:
            continue
        print(f"{name}: {t}", file=sys.stderr, flush=True)
        try:
            proc = subprocess.run([sys.executable, script, "--one", t], capture_output=True, text=True,
                                  timeout=limit_s, cwd=cwd)
            row = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else \
                failed(t, (proc.stderr.strip().splitlines() or ["?"])[-1])
        except subprocess.TimeoutExpired:
            row = failed(t, f"over {limit_s} s")
        done[t] = row
        with jsonl.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
    return done
