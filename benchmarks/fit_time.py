"""How long `gpuwise fit` takes for Llama-2-7B on a 24 GB card (issue 20: <= 10 s idle; `--gpu all` <= 15 s).

    python benchmarks/fit_time.py            # the one-GPU command, then each top-3 option's estimate_cmd
    python benchmarks/fit_time.py --all      # also `--gpu all`
    python benchmarks/fit_time.py --no-check # timings only

Runs `gpuwise fit examples/configs/llama-2-7b.json --gpu rtx4090 --json` in a child process and records its
wall time, its CPU time (user + sys of the child and the forks it waited for), the machine's load average
before and after (the machine is shared: a loaded run is slower in wall time, and fit traces one by one
when no CPU is idle), and, with the check, whether each of the top 3 fitting options' `device_used_bytes`
is what its `estimate_cmd` prints, to the byte. Appends to benchmarks/results/fit_time.jsonl.

The machines this runs on differ by 2-3x from session to session (session 21's took 9 s for the fit that
session 25's, an AMD EPYC where `import torch` alone takes 3.9 s, took 23-27 s), so each run also records the
CPU's model name and the wall time of one `gpuwise estimate` of the same model (batch 8, the same GPU):
`fit_over_estimate` compares fits across machines (the issue's own yardstick: 33 s against one estimate's 3.9 s).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIT = ["gpuwise", "fit", "examples/configs/llama-2-7b.json", "--json"]
ESTIMATE = ["gpuwise", "estimate", "examples/configs/llama-2-7b.json", "-b", "8", "--gpu", "rtx4090", "--json"]


def _cpu_model() -> str | None:
    """The CPU's model name (/proc/cpuinfo), or None where it does not say."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        return None


def _timed(args: list[str]) -> tuple[dict, dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "gpuwise", *args[1:]], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return json.loads(proc.stdout), {"command": shlex.join(args), "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
                                     "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="also time --gpu all")
    ap.add_argument("--no-check", action="store_true", help="skip running the top 3 options' estimate_cmd")
    ap.add_argument("--label", default="", help="a word to tell runs apart in the results file")
    a = ap.parse_args()
    rows = []
    result, row = _timed(FIT + ["--gpu", "rtx4090"])
    rows.append(row)
    _, reference = _timed(ESTIMATE)
    row["estimate_wall_s"] = reference["wall_s"]
    row["fit_over_estimate"] = round(row["wall_s"] / reference["wall_s"], 2)
    if not a.no_check:
        top = [o for o in result["options"] if o["fits"]][:3]
        row["top3"] = []
        for o in top:
            est, _ = _timed(shlex.split(o["estimate_cmd"]) + ["--json"])
            row["top3"].append({"name": o["name"], "fit_bytes": o["device_used_bytes"],
                                "estimate_bytes": est["device_used_bytes"]})
        row["top3_equal"] = all(t["fit_bytes"] == t["estimate_bytes"] for t in row["top3"])
    if a.all:
        rows.append(_timed(FIT + ["--gpu", "all"])[1])
    stamp = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": len(os.sched_getaffinity(0)),
             "cpu_model": _cpu_model(), "label": a.label}
    out = ROOT / "benchmarks" / "results" / "fit_time.jsonl"
    with out.open("a") as f:
        for r in rows:
            f.write(json.dumps({**stamp, **r}) + "\n")
            print(json.dumps(r))


if __name__ == "__main__":
    main()
