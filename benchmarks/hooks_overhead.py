"""How much does `gpuwise watch -- CMD`'s bootstrap (the zero-code hooks) slow a training loop? Goal: <= 1%.

    python benchmarks/hooks_overhead.py [--reps 7] [--seconds 3] [--compare-with REV]

The same unmodified loop (an MLP, SGD, a DataLoader over in-memory tensors, 1 intra-op thread, epochs of
200 batches) runs as a child process without and with the bootstrap's environment, in an order rotated
rep by rep so that drift on a shared machine hits each alike; `--compare-with REV` adds the bootstrap of
git revision REV as a third variant (before -> after in the same runs). Each run trains for `--seconds`
after 20 warm-up steps and reports the main thread's CPU seconds per step as a mean (total / steps: the
hooks' periodic work -- writing the step records every second, reading /proc -- counts) and a median.
Reported: the hooks' own cost in microseconds per step (median over reps of the paired mean-CPU
differences on a loop whose step is a 1-parameter SGD step, "bare"), that cost as a share of each
config's step, and the paired hooked/plain CPU ratio of each config. Results:
benchmarks/results/hooks_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# name -> (hidden width, batch size); "bare": an almost empty step, to see the hooks' own cost
CONFIGS = {"bare": (0, 1), "small": (256, 64), "medium": (1024, 256)}

LOOP = r'''
import json, statistics, sys, time
import torch
torch.set_num_threads(1)
hidden, batch, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
torch.manual_seed(0)
if hidden:
    model = torch.nn.Sequential(torch.nn.Linear(256, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
else:
    model = torch.nn.Linear(1, 1, bias=False)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
n = batch * 200
ds = torch.utils.data.TensorDataset(torch.randn(n, 256 if hidden else 1), torch.randint(0, 10, (n,)))
cpu, steps, i = [], 0, 0
t, c = time.perf_counter(), time.thread_time()
while True:
    for x, y in torch.utils.data.DataLoader(ds, batch_size=batch):
        if hidden:
            torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        cnow = time.thread_time()
        if i == 20:
            t0, c0 = time.perf_counter(), cnow
        elif i > 20:
            cpu.append(cnow - c)
        c, i = cnow, i + 1
    if i > 20 and time.perf_counter() - t0 >= seconds:
        break
steps = i - 21
print(json.dumps({"cpu_mean_s": (time.thread_time() - c0) / steps, "cpu_median_s": statistics.median(cpu),
                  "wall_mean_s": (time.perf_counter() - t0) / steps, "steps": steps,
                  "hooked": "_gpuwise_hooks" in sys.modules}))
'''


def run(hidden: int, batch: int, seconds: float, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", LOOP, str(hidden), str(batch), str(seconds)], env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def baseline_env(rev: str, folder: str, plain_env: dict) -> dict:
    """The bootstrap's environment with the hooks of git revision `rev` (its src/gpuwise/bootstrap/)."""
    from gpuwise.bootstrap import environment

    tree = os.path.join(folder, "baseline")
    os.makedirs(tree)
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "src/gpuwise/bootstrap"], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    env = environment(os.path.join(folder, "baseline-out"), plain_env)
    site = os.path.join(folder, "baseline-out", "site", "sitecustomize.py")
    ours = os.path.join(ROOT, "src", "gpuwise", "bootstrap", "hooks.py")
    with open(site) as fh:
        text = fh.read()
    with open(site, "w") as fh:
        fh.write(text.replace(repr(ours), repr(os.path.join(tree, "src", "gpuwise", "bootstrap", "hooks.py"))))
    return env


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--seconds", type=float, default=3.0, help="training time per run after warm-up")
    p.add_argument("--compare-with", metavar="REV", help="also run the bootstrap of this git revision")
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated: " + ", ".join(CONFIGS))
    args = p.parse_args()
    sys.path.insert(0, os.path.join(ROOT, "src"))
    from gpuwise.bootstrap import environment

    folder = tempfile.mkdtemp(prefix="gpuwise-overhead-")
    plain_env = dict(os.environ)
    variants = {"plain": plain_env, "hooked": environment(os.path.join(folder, "hooked"), plain_env)}
    if args.compare_with:
        variants["baseline"] = baseline_env(args.compare_with, folder, plain_env)
    names = list(variants)
    result = {"cpu_count": os.cpu_count(), "load_avg_start": os.getloadavg(), "reps": args.reps,
              "seconds": args.seconds, "baseline_rev": args.compare_with, "configs": {}}
    for name in args.configs.split(","):
        hidden, batch = CONFIGS[name]
        runs: dict[str, list[dict]] = {v: [] for v in names}
        for r in range(args.reps):
            for v in names[r % len(names):] + names[:r % len(names)]:  # rotate the order rep by rep
                runs[v].append(run(hidden, batch, args.seconds, variants[v]))
                assert runs[v][-1]["hooked"] == (v != "plain")
        c = {"hidden": hidden, "batch": batch, "runs": runs,
             "plain_cpu_s": statistics.median(a["cpu_mean_s"] for a in runs["plain"])}
        for v in names[1:]:
            pairs = list(zip(runs["plain"], runs[v]))
            c[f"{v}_cpu_s"] = statistics.median(b["cpu_mean_s"] for b in runs[v])
            c[f"{v}_cost_us"] = statistics.median(b["cpu_mean_s"] - a["cpu_mean_s"] for a, b in pairs) * 1e6
            c[f"{v}_cpu_ratio"] = statistics.median(b["cpu_mean_s"] / a["cpu_mean_s"] for a, b in pairs)
            c[f"{v}_median_step_ratio"] = statistics.median(b["cpu_median_s"] / a["cpu_median_s"] for a, b in pairs)
            # the cost as the median step sees it (the measure of earlier runs): periodic work left out
            c[f"{v}_median_step_cost_us"] = statistics.median(b["cpu_median_s"] - a["cpu_median_s"]
                                                              for a, b in pairs) * 1e6
        result["configs"][name] = c
        print(f"{name:7s} step {c['plain_cpu_s'] * 1e3:8.3f} ms CPU; " + "; ".join(
            f"{v}: +{c[f'{v}_cost_us']:.1f} us, x{c[f'{v}_cpu_ratio']:.4f}" for v in names[1:]), flush=True)
    result["load_avg_end"] = os.getloadavg()
    if "bare" in result["configs"]:
        bare = result["configs"]["bare"]
        for v in names[1:]:
            result[f"{v}_cost_us_per_step"] = max(bare[f"{v}_cost_us"], 0.0)
        print(f"\nhooks' own cost (bare loop, {bare['plain_cpu_s'] * 1e6:.0f} us per step plain): "
              + ", ".join(f"{v} {result[f'{v}_cost_us_per_step']:.1f} us per step (median step: "
                          f"{bare[f'{v}_median_step_cost_us']:.1f} us)" for v in names[1:]))
        print("| config | step (CPU) | " + " | ".join(f"{v}: cost as a share of the step | {v}: paired CPU ratio"
                                                      for v in names[1:]) + " |")
        print("|---|---|" + "---|---|" * (len(names) - 1))
        for name, c in result["configs"].items():
            if name == "bare":
                continue
            cells = []
            for v in names[1:]:
                c[f"{v}_cost_fraction"] = result[f"{v}_cost_us_per_step"] * 1e-6 / c["plain_cpu_s"]
                cells += [f"{100 * c[f'{v}_cost_fraction']:.2f}%", f"x{c[f'{v}_cpu_ratio']:.4f}"]
            print(f"| {name} | {c['plain_cpu_s'] * 1e3:.2f} ms | " + " | ".join(cells) + " |")
    print(f"load average: {result['load_avg_start'][0]:.2f} at the start, {result['load_avg_end'][0]:.2f} at the end")
    path = os.path.join(ROOT, "benchmarks", "results", "hooks_overhead.json")
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"written {path}")


if __name__ == "__main__":
    main()
