"""Does `gpuwise tune -- python train.py` give the same answer run after run on a busy machine?

    nice python benchmarks/tune_consistency.py --runs 5 --budget 60s   # ~6 min on 2 cores

Starts one other CPU-bound process (`python -c 'while True: pass'`, killed by its pid at the end), then runs
`gpuwise tune --json --budget B -- python tests/scripts/starved.py ...` RUNS times, each with a fresh results
file, and records each answer: the settings it recommends (or none: "no change helps at this noise"), the
decision's reason and the trials' bands. Writes benchmarks/results/tune_consistency-cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = [sys.executable, os.path.join(ROOT, "tests", "scripts", "starved.py"), "--steps", "100000", "--width", "32"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--budget", default="60s")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "tune_consistency-cpu.json"))
    args = p.parse_args()
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    answers = []
    t0 = time.time()
    try:
        for i in range(args.runs):
            out = subprocess.run([sys.executable, "-m", "gpuwise", "tune", "--json", "--budget", args.budget, "--",
                                  *SCRIPT], capture_output=True, text=True, env=env, timeout=1800)
            d = json.loads(out.stdout)
            answer = d["best"]["overrides"] if d["decision"].get("changed") else {}
            answers.append({"run": i, "answer": answer, "decision": d["decision"], "speedup": d["speedup"],
                            "elapsed_s": d["elapsed_s"], "load_average": os.getloadavg(),
                            "trials": [{k: t[k] for k in ("overrides", "repeat", "samples_per_s", "samples_per_s_low",
                                                          "samples_per_s_high", "steps")} for t in d["trials"]]})
            print(f"run {i}: {answer or 'no change'} - {d['decision']['reason']}", file=sys.stderr)
    finally:
        hog.kill()
        hog.wait()
    same = all(a["answer"] == answers[0]["answer"] for a in answers)
    result = {"command": f"nice python benchmarks/tune_consistency.py --runs {args.runs} --budget {args.budget}",
              "script": SCRIPT[1:], "cpu_count": os.cpu_count(), "other_process": "python -c 'while True: pass'",
              "seconds": time.time() - t0, "same_answer_every_run": same, "runs": answers}
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(json.dumps({"same_answer_every_run": same, "answers": [a["answer"] for a in answers]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
