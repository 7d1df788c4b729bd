"""`gpuwise tune -- python train.py` on an unmodified data-starved script: does it find >= 1 worker and
>= 1.5x the script's own samples/s within a 90 s budget?

    python benchmarks/tune_script.py            # ~6 min on 2 cores; writes benchmarks/results/tune_script-cpu.json

The script is tests/scripts/starved.py (a Dataset spending ~5 ms of CPU per sample, num_workers=0, a small
CNN whose step costs about as much as loading its batch). Three tunes, each with a fresh results file and a
90 s budget; then the best settings of each are confirmed against the script as it is by alternating
5 s trials (3 of each), and the medians are compared.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = [sys.executable, os.path.join(ROOT, "tests", "scripts", "starved.py"), "--steps", "100000", "--width", "32"]
BUDGET = "90s"
RUNS = 3


def main() -> None:
    sys.path.insert(0, os.path.join(ROOT, "src"))
    from gpuwise.tuning.script import run_script_trial

    tunes = []
    for i in range(RUNS):
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "gpuwise", "tune", "--json", "--budget", BUDGET, "--", *SCRIPT],
                             capture_output=True, text=True, check=True).stdout
        d = json.loads(out)
        tunes.append({"wall_s": time.monotonic() - t0, "best": d["best"], "baseline": d["baseline"],
                      "speedup": d["speedup"], "trials": len(d["trials"]), "code_change": d["code_change"]})
        print(f"tune {i + 1}: {d['code_change']}  x{d['speedup']:.2f} in {tunes[-1]['wall_s']:.0f}s "
              f"({len(d['trials'])} trials)", flush=True)
    confirm = []
    for tune in tunes:
        own, best = [], []
        for _ in range(3):
            own.append(run_script_trial(SCRIPT, {}, measure_s=5.0).samples_per_s)
            best.append(run_script_trial(SCRIPT, tune["best"]["overrides"], measure_s=5.0).samples_per_s)
        confirm.append({"overrides": tune["best"]["overrides"], "own_samples_per_s": own,
                        "best_samples_per_s": best,
                        "ratio_of_medians": statistics.median(best) / statistics.median(own)})
    workers = [int(t["best"].get("num_workers") or 0) for t in tunes]
    result = {
        "machine": f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end", "budget": BUDGET,
        "command": "gpuwise tune --json --budget 90s -- python tests/scripts/starved.py --steps 100000 --width 32",
        "tunes": tunes, "confirm": confirm,
        "median_tune_speedup": statistics.median(t["speedup"] for t in tunes),
        "median_confirmed_ratio": statistics.median(c["ratio_of_medians"] for c in confirm),
        "median_wall_s": statistics.median(t["wall_s"] for t in tunes),
        "workers_found": workers,
    }
    print("\n| run | best settings | speedup in the tune | confirmed (median of 3 vs 3) | wall |")
    print("|---|---|---|---|---|")
    for i, (t, c) in enumerate(zip(tunes, confirm)):
        print(f"| {i + 1} | {t['best']['overrides'] or 'as is'} | x{t['speedup']:.2f} | x{c['ratio_of_medians']:.2f} "
              f"| {t['wall_s']:.0f}s |")
    print(f"median: x{result['median_tune_speedup']:.2f} in the tune, x{result['median_confirmed_ratio']:.2f} "
          f"confirmed; workers found {workers}")
    path = os.path.join(ROOT, "benchmarks", "results", "tune_script-cpu.json")
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"written {path}")


if __name__ == "__main__":
    main()
