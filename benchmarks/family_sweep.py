"""`gpuwise estimate` on every causal-LM family transformers knows, at its default (published-size) config.

    nice python benchmarks/family_sweep.py                      # every family, bf16 (resumes: done ones kept)
    nice python benchmarks/family_sweep.py --lora 16            # the same with LoRA r16
    python benchmarks/family_sweep.py --types llama,mistral     # some families
    python benchmarks/family_sweep.py --table                   # the recorded table, run nothing
    nice python benchmarks/family_sweep.py --again whole        # re-run the families recorded with a status

A user's Hub model is a config.json gpuwise has not seen. For each `model_type` of transformers'
MODEL_FOR_CAUSAL_LM_MAPPING, its config class's defaults (usually the family's first published size) are
written as a config.json (`to_json_string`, as `save_pretrained` writes it) and `gpuwise estimate CONFIG -b 1
--seq-len 512 --gpu H100 --precision bf16 --no-max-batch --json` runs in a child process (300 s limit). Each
family gets one status:

- rebuilt: the repeated blocks were rebuilt from 3- and 4-block traces (the fast, exact path);
- whole: traced at full depth, with the note saying why the blocks could not be reused;
- cannot tell: gpuwise said so, one line (e.g. routing that reads data, too big to trace on real tensors);
- user error: exit 2 with the model's own failure (transformers cannot build or run the default config);
- internal error / timeout / no config: gpuwise's defects, or a config class without usable defaults.

Rows are appended to benchmarks/results/family_sweep[-lora].jsonl as they come; the summary (counts, and the
table) goes to the .json beside it. Nothing here is a truth: it checks that gpuwise answers, and how.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
LIMIT_S = 300


def families() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def status_of(rc: int | None, out: str, err: str) -> tuple[str, str]:
    """(status, detail) of one run."""
    if rc is None:
        return "timeout", f"over {LIMIT_S} s"
    last = (err.strip().splitlines() or [""])[-1]
    if rc == 0:
        notes = json.loads(out).get("notes", [])
        if any(n.startswith("repeated blocks: traced with") for n in notes):
            return "rebuilt", ""
        why = next((n for n in notes if n.startswith("traced whole")), "no repeated blocks")
        return "whole", why
    if "internal error" in last:
        return "internal error", last
    if "cannot tell" in last:
        return "cannot tell", last
    return "user error", last


def run_one(model_type: str, extra: list[str], folder: Path) -> dict:
    from transformers import AutoConfig

    row: dict = {"type": model_type}
    try:
        text = AutoConfig.for_model(model_type).to_json_string()
    except Exception as exc:  # noqa: BLE001 - a config class whose defaults do not validate
        return {**row, "status": "no config", "detail": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    path = folder / f"{model_type}.json"
    path.write_text(text)
    cmd = [sys.executable, "-m", "gpuwise", "estimate", str(path), "-b", "1", "--seq-len", "512", "--gpu", "H100",
           "--precision", "bf16", "--no-max-batch", "--json", *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT_S, env=env)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired:
        rc, out, err = None, "", ""
    row["seconds"] = round(time.perf_counter() - t0, 1)
    row["status"], row["detail"] = status_of(rc, out, err)
    if rc == 0:
        row["device_gib"] = round(json.loads(out)["device_used_bytes"] / 2**30, 2)
    return row


def table(rows: list[dict]) -> str:
    lines = ["| family | status | s | GiB | detail |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['type']} | {r['status']} | {r.get('seconds', '')} | {r.get('device_gib', '')} | "
                     f"{r.get('detail', '')[:140].replace('|', '/')} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", help="comma-separated model types (default: every causal-LM family)")
    ap.add_argument("--lora", type=int, help="also --lora RANK")
    ap.add_argument("--fresh", action="store_true", help="forget recorded rows and start over")
    ap.add_argument("--table", action="store_true", help="print the recorded table and run nothing")
    ap.add_argument("--again", help="comma-separated statuses: re-run the families recorded with one (their new "
                    "rows are appended and replace the old ones)")
    a = ap.parse_args()
    name = "family_sweep" + ("-lora" if a.lora else "")
    rows_path, summary_path = RESULTS / f"{name}.jsonl", RESULTS / f"{name}.json"
    if a.fresh and rows_path.exists():
        rows_path.unlink()
    done = {json.loads(line)["type"]: json.loads(line) for line in rows_path.open()} if rows_path.exists() else {}
    again = set(a.again.split(",")) if a.again else set()
    todo = [t for t in (a.types.split(",") if a.types else families())
            if t not in done or done[t]["status"] in again]
    extra = ["--lora", str(a.lora)] if a.lora else []
    with tempfile.TemporaryDirectory() as tmp:
        for i, model_type in enumerate([] if a.table else todo, 1):
            row = run_one(model_type, extra, Path(tmp))
            with rows_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            done[model_type] = row
            print(f"[{i}/{len(todo)}] {model_type}: {row['status']} {row.get('seconds', '')} s", file=sys.stderr)
    rows = [done[t] for t in sorted(done)]
    import torch
    import transformers

    summary = {"torch": torch.__version__, "transformers": transformers.__version__, "extra_args": extra,
               "counts": dict(Counter(r["status"] for r in rows)), "rows": rows}
    tmp_path = summary_path.with_suffix(".json.tmp")
    tmp_path.write_text(json.dumps(summary, indent=1) + "\n")
    tmp_path.replace(summary_path)
    print(table(rows))
    print(f"\n{summary['counts']}")


if __name__ == "__main__":
    main()
