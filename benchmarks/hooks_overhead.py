"""How much does `gpuwise watch -- CMD`'s bootstrap (the zero-code hooks) slow a training loop? Goal: <= 1%.

    python benchmarks/hooks_overhead.py [--reps 7] [--steps 300]

The same unmodified loop (an MLP, SGD, a DataLoader over in-memory tensors, 1 intra-op thread) runs as a
child process with and without the bootstrap's environment, interleaved rep by rep so that drift on a
shared machine hits both alike. Per run: the median wall and main-thread CPU seconds per step after 20
warm-up steps. Reported: the median over reps of the paired ratios (hooked / plain), and the hooks' bare
per-step cost in microseconds (a loop whose step is a 1-parameter SGD step), as a share of each config's
step. Results: benchmarks/results/hooks_overhead.json.
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
hidden, batch, steps = map(int, sys.argv[1:4])
torch.manual_seed(0)
if hidden:
    model = torch.nn.Sequential(torch.nn.Linear(256, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
else:
    model = torch.nn.Linear(1, 1, bias=False)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
n = batch * (steps + 20)
ds = torch.utils.data.TensorDataset(torch.randn(n, 256 if hidden else 1), torch.randint(0, 10, (n,)))
wall, cpu = [], []
t, c = time.perf_counter(), time.thread_time()
for i, (x, y) in enumerate(torch.utils.data.DataLoader(ds, batch_size=batch)):
    if hidden:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    now, cnow = time.perf_counter(), time.thread_time()
    if i >= 20:
        wall.append(now - t); cpu.append(cnow - c)
    t, c = now, cnow
print(json.dumps({"wall_s": statistics.median(wall), "cpu_s": statistics.median(cpu),
                  "hooked": "_gpuwise_hooks" in sys.modules}))
'''


def run(hidden: int, batch: int, steps: int, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", LOOP, str(hidden), str(batch), str(steps)], env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--steps", type=int, default=300)
    args = p.parse_args()
    sys.path.insert(0, os.path.join(ROOT, "src"))
    from gpuwise.bootstrap import environment

    folder = tempfile.mkdtemp(prefix="gpuwise-overhead-")
    plain_env = dict(os.environ)
    hooked_env = environment(folder, plain_env)
    result = {"cpu_count": os.cpu_count(), "reps": args.reps, "steps": args.steps, "configs": {}}
    for name, (hidden, batch) in CONFIGS.items():
        pairs = []
        for _ in range(args.reps):
            a = run(hidden, batch, args.steps, plain_env)
            b = run(hidden, batch, args.steps, hooked_env)
            assert b["hooked"] and not a["hooked"]
            pairs.append((a, b))
        wall = statistics.median(b["wall_s"] / a["wall_s"] for a, b in pairs)
        cpu = statistics.median(b["cpu_s"] / a["cpu_s"] for a, b in pairs)
        plain_cpu = statistics.median(a["cpu_s"] for a, _ in pairs)
        hooked_cpu = statistics.median(b["cpu_s"] for _, b in pairs)
        result["configs"][name] = {"hidden": hidden, "batch": batch, "pairs": pairs, "wall_ratio": wall,
                                   "cpu_ratio": cpu, "plain_cpu_s": plain_cpu, "hooked_cpu_s": hooked_cpu}
        print(f"{name:7s} step {plain_cpu * 1e3:8.3f} ms CPU; hooked/plain: CPU x{cpu:.4f}, wall x{wall:.4f}",
              flush=True)
    bare = result["configs"]["bare"]
    cost_s = max(bare["hooked_cpu_s"] - bare["plain_cpu_s"], 0.0)
    result["hooks_cost_us_per_step"] = cost_s * 1e6
    print(f"\nhooks' own cost: {cost_s * 1e6:.1f} us per step (bare loop: {bare['plain_cpu_s'] * 1e6:.0f} -> "
          f"{bare['hooked_cpu_s'] * 1e6:.0f} us)")
    print("| config | step (CPU) | hooks' cost as a share of the step | paired CPU ratio (median) |")
    print("|---|---|---|---|")
    for name in ("small", "medium"):
        c = result["configs"][name]
        share = cost_s / c["plain_cpu_s"]
        c["hooks_cost_fraction"] = share
        print(f"| {name} | {c['plain_cpu_s'] * 1e3:.2f} ms | {100 * share:.2f}% | x{c['cpu_ratio']:.4f} |")
    path = os.path.join(ROOT, "benchmarks", "results", "hooks_overhead.json")
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"written {path}")


if __name__ == "__main__":
    main()
