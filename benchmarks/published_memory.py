"""gpuwise's memory estimate against every published memory measurement in benchmarks/published/.

    python benchmarks/published_memory.py                 # every expressible memory row not yet computed
    python benchmarks/published_memory.py --rerun         # recompute all of them
    python benchmarks/published_memory.py --only 'phi'    # rows whose id matches a regex (add --rerun to recompute)
    python benchmarks/published_memory.py --table         # only rewrite the README table from the results

Each row's setting is expressed as `gpuwise estimate <setting.workload> <gpuwise_args> --json
--no-max-batch`, run in its own process (a crash or abort on one row cannot stop the rest). The published
metric picks the number compared (corpus.MEMORY_METRICS): max allocated and active peak against
peak_allocated_bytes, max reserved against peak_reserved_bytes, nvidia-smi against device_used_bytes;
GB is 1e9 bytes, GiB 2**30. A published OOM is predicted when device_used_bytes exceeds the GPU's memory
(the catalog's total). Results are written atomically after every row to
benchmarks/results/published_memory.json (merged under a lock, so two runs on disjoint `--only` sets can
share it), so an interrupted run resumes where it stopped; the summary
(median and max |error| per metric and per source, every row listed) replaces the table between the
markers in benchmarks/published/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks" / "published"))

import corpus  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "published_memory.json"
README = ROOT / "benchmarks" / "published" / "README.md"
BEGIN, END = "<!-- published_memory:begin -->", "<!-- published_memory:end -->"
TIMEOUT_S = 900
# The targets (|error|, %): median and max per metric group.
TARGETS = {"allocated": (3.0, 8.0), "reserved": (5.0, 10.0)}
GROUP = {"max_allocated": "allocated", "active": "allocated", "max_reserved": "reserved", "nvidia_smi": "reserved"}


def command(row: dict) -> list[str]:
    """The gpuwise command line that expresses `row` (the CLI, as a user types it)."""
    return [sys.executable, "-m", "gpuwise", "estimate", corpus.workload_path(row), *row["gpuwise_args"],
            "--json", "--no-max-batch"]


def gpu_memory_bytes(name: str | None) -> int | None:
    if not name:
        return None
    from gpuwise.errors import GpuwiseError
    from gpuwise.plan import lookup_gpu
    try:
        return int(lookup_gpu(name).memory_bytes)
    except GpuwiseError:  # a GPU the catalog does not have (e.g. H100 96GB): no OOM verdict
        return None


def compare(row: dict, est: dict) -> dict:
    """Published vs predicted for one row: the error in % (signed) or, for an OOM row, whether predicted."""
    key = corpus.MEMORY_METRICS[row["metric"]]
    out = {"predicted_key": key, "peak_allocated_bytes": est.get("peak_allocated_bytes"),
           "peak_reserved_bytes": est.get("peak_reserved_bytes"), "device_used_bytes": est.get("device_used_bytes")}
    limit = gpu_memory_bytes(row["setting"].get("gpu"))
    out["gpu_memory_bytes"] = limit
    if limit and est.get("device_used_bytes") is not None:
        out["predicted_oom"] = est["device_used_bytes"] > limit
    if row["metric"] == "oom":
        return out
    if key == "peak_reserved_bytes" and est.get(key) is None:  # inference answers allocated and device used only
        key = "device_used_bytes"
    truth = corpus.published_bytes(row)
    out["published_bytes"] = truth
    out["predicted_bytes"] = est.get(key)
    if out["predicted_bytes"] is not None:
        out["err_pct"] = round(100 * (out["predicted_bytes"] - truth) / truth, 2)
    return out


def run_row(row: dict, timeout_s: float = TIMEOUT_S) -> dict:
    """Run gpuwise on one row; the result record (error text instead of numbers when it failed)."""
    cmd = command(row)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    rec = {"id": row["id"], "args": row["gpuwise_args"], "workload": row["setting"]["workload"],
           "metric": row["metric"], "source": row["source"]["name"]}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {**rec, "error": f"timeout after {timeout_s:.0f} s", "seconds": round(time.perf_counter() - t0, 1)}
    rec["seconds"] = round(time.perf_counter() - t0, 1)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {**rec, "error": f"exit {proc.returncode}: {tail[-300:]}"}
    est = json.loads(proc.stdout)
    return {**rec, **compare(row, est), "modes": est.get("modes"), "peak_op": est.get("peak_op")}


def write_atomic(path: Path, data: dict) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def store(rec: dict) -> dict:
    """Add one row's result to the results file (read, update, write under a lock); the whole results."""
    import fcntl
    import hashlib
    import tempfile

    name = hashlib.sha1(str(RESULTS.resolve()).encode()).hexdigest()[:12]
    with open(Path(tempfile.gettempdir()) / f"gpuwise-published-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        results = load_results()
        results[rec["id"]] = rec
        write_atomic(RESULTS, results)
    return results


def load_results() -> dict:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {}


def _stats(errs: list[float]) -> str:
    if not errs:
        return "– | –"
    return f"{statistics.median(map(abs, errs)):.1f} % | {max(map(abs, errs)):.1f} %"


def summary(rows: list[dict], results: dict) -> dict:
    """Counts, per-metric and per-source median/max |error| and OOM hits, as data."""
    mem = [r for r in rows if corpus.is_memory(r)]
    results = current(rows, results)
    done = [results[r["id"]] for r in mem if r["id"] in results]
    ok = [d for d in done if "err_pct" in d]
    out = {"memory_rows": len(mem), "expressible": sum(map(corpus.expressible, mem)),
           "sources": len({r["source"]["name"] for r in mem}), "computed": len(done),
           "failed": sum("error" in d for d in done), "by_metric": {}, "by_source": {}, "by_group": {}}
    for field, key in (("by_metric", "metric"), ("by_source", "source")):
        for name in sorted({d[key] for d in ok}):
            errs = [d["err_pct"] for d in ok if d[key] == name]
            out[field][name] = {"n": len(errs), "median_abs_pct": round(statistics.median(map(abs, errs)), 2),
                                "max_abs_pct": round(max(map(abs, errs)), 2)}
    for group in TARGETS:
        errs = [d["err_pct"] for d in ok if GROUP.get(d["metric"]) == group]
        if errs:
            out["by_group"][group] = {"n": len(errs), "median_abs_pct": round(statistics.median(map(abs, errs)), 2),
                                      "max_abs_pct": round(max(map(abs, errs)), 2), "target": TARGETS[group]}
    ooms = [d for d in done if d["metric"] == "oom" and "error" not in d]
    out["oom"] = {"published": sum(r["metric"] == "oom" for r in mem), "computed": len(ooms),
                  "predicted": sum(bool(d.get("predicted_oom")) for d in ooms)}
    # the other side of the verdict: runs that completed (a memory number was published) on a catalog GPU
    ran = [d for d in done if d["metric"] != "oom" and "error" not in d and "predicted_oom" in d]
    out["ran"] = {"computed": len(ran), "predicted_oom": sum(bool(d["predicted_oom"]) for d in ran)}
    return out


def current(rows: list[dict], results: dict) -> dict:
    """The results computed with each row's present arguments and workload (a row that changed is not run)."""
    now = {r["id"]: (r["gpuwise_args"], r["setting"]["workload"]) for r in rows}
    return {k: v for k, v in results.items() if k in now and (v.get("args"), v.get("workload")) == now[k]}


def table(rows: list[dict], results: dict) -> str:
    results = current(rows, results)
    s = summary(rows, results)
    lines = [f"{s['memory_rows']} published memory rows from {s['sources']} sources, {s['expressible']} expressible "
             f"({100 * s['expressible'] / max(1, s['memory_rows']):.0f} %); {s['computed']} computed, "
             f"{s['failed']} failed. Published OOMs predicted OOM: {s['oom']['predicted']} of {s['oom']['computed']} "
             f"computed ({s['oom']['published']} published). Runs that completed predicted OOM (a false alarm): "
             f"{s['ran']['predicted_oom']} of {s['ran']['computed']} on a catalog GPU.", "",
             "| group | rows | median abs error | max abs error | target (median, max) |", "|---|---|---|---|---|"]
    for g, v in s["by_group"].items():
        lines.append(f"| {g} | {v['n']} | {v['median_abs_pct']:.1f} % | {v['max_abs_pct']:.1f} % | "
                     f"≤ {v['target'][0]:.0f} %, ≤ {v['target'][1]:.0f} % |")
    lines += ["", "| metric / source | rows | median abs error | max abs error |", "|---|---|---|---|"]
    for field in ("by_metric", "by_source"):
        for name, v in s[field].items():
            lines.append(f"| {name} | {v['n']} | {v['median_abs_pct']:.1f} % | {v['max_abs_pct']:.1f} % |")
    lines += ["", "| id | metric | published | predicted | error |", "|---|---|---|---|---|"]
    for r in rows:
        if not corpus.is_memory(r):
            continue
        pub = "OOM" if r["metric"] == "oom" else f"{r['value']} {r['unit']}"
        d = results.get(r["id"])
        if not corpus.expressible(r):
            pred, err = "not expressible", r["why_not"]
        elif d is None:
            pred, err = "not run", ""
        elif "error" in d:
            pred, err = "failed", d["error"].replace("|", "/")[:120]
        elif r["metric"] == "oom":
            pred = "OOM" if d.get("predicted_oom") else f"fits ({d['device_used_bytes'] / 1e9:.2f} GB used)"
            err = "ok" if d.get("predicted_oom") else "**missed**"
        else:
            pred = f"{d['predicted_bytes'] / corpus.UNIT_BYTES[r['unit']]:.2f} {r['unit']}"
            err = f"{d['err_pct']:+.1f} %"
        lines.append(f"| {r['id']} | {r['metric']} | {pub} | {pred} | {err} |")
    return "\n".join(lines)


def update_readme(text: str) -> None:
    readme = README.read_text()
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rerun", action="store_true", help="recompute rows that already have a result")
    ap.add_argument("--only", metavar="REGEX", help="only rows whose id matches")
    ap.add_argument("--table", action="store_true", help="only rewrite the README table from stored results")
    ap.add_argument("--failed", action="store_true", help="recompute rows whose last run failed")
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S, metavar="S",
                    help=f"seconds one row may take (default {TIMEOUT_S}; a deep model's long generation on a busy "
                    "machine takes more)")
    args = ap.parse_args(argv)
    rows = corpus.load_rows()
    results = load_results()
    todo = [r for r in rows if corpus.is_memory(r) and corpus.expressible(r)]
    if args.only:
        todo = [r for r in todo if re.search(args.only, r["id"])]
    if args.failed:
        todo = [r for r in todo if "error" in results.get(r["id"], {})]
    elif not args.rerun:  # resume: rows with a result for the same arguments and workload are kept
        kept = current(rows, results)
        todo = [r for r in todo if r["id"] not in kept]
    if args.table:
        todo = []
    for n, row in enumerate(todo, 1):
        rec = run_row(row, args.timeout)
        results = store(rec)
        shown = rec.get("error") or (f"{rec['err_pct']:+.1f} %" if "err_pct" in rec
                                     else f"predicted OOM: {rec.get('predicted_oom')}")
        print(f"[{n}/{len(todo)}] {row['id']}: {shown} ({rec.get('seconds')} s)", flush=True)
    text = table(rows, results)
    update_readme(text)
    print(text.split("\n\n| id")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
