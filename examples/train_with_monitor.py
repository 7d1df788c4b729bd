"""A plain PyTorch training loop under `gpuwise.monitor`: read top to bottom.

The dataset simulates slow reads (`--read-ms` per sample, a sleep standing in for disk or network
I/O), so with the default `--workers 0` the loop is data-bound and the monitor says so:

    python examples/train_with_monitor.py                       # data_starvation: use N workers
    python examples/train_with_monitor.py --workers 4 --pin-memory
    python examples/train_with_monitor.py --read-ms 0           # compute_bound (CPU) / healthy (GPU)
    gpuwise watch --report run.html -- python examples/train_with_monitor.py
    torchrun --nproc-per-node 2 examples/train_with_monitor.py --out-dir runs/mon   # a file per rank;
    python -c "import gpuwise; print(gpuwise.merged_summary('runs/mon', report='ddp.html'))"
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from torch import nn
from torch.nn import functional as F

import gpuwise


class SlowImages(torch.utils.data.Dataset):
    """3x16x16 images and 10 classes; each read sleeps `read_ms` (simulated storage latency)."""

    def __init__(self, n: int, read_ms: float):
        self.n, self.read_s = n, read_ms / 1000

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.read_s:
            time.sleep(self.read_s)
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, 16, 16, generator=g), i % 10


def model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(32, 10))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--read-ms", type=float, default=1.0, help="simulated read latency per sample")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--pin-memory", action="store_true")
    ap.add_argument("--report", help="write an HTML report here")
    ap.add_argument("--out-dir", help="write per-rank step files here (DDP)")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args()

    device = gpuwise.try_gpu(int(os.environ.get("LOCAL_RANK", "0")))  # under torchrun: one GPU per rank
    net = model().to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    data = SlowImages(args.steps * args.batch_size, args.read_ms)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                                         pin_memory=args.pin_memory, persistent_workers=args.workers > 0)

    with gpuwise.monitor(device=device, report=args.report, out_dir=args.out_dir) as mon:
        for x, y in mon.loader(loader):            # times the wait for each batch
            x, y = mon.to_device((x, y))           # times the host-to-device copy
            loss = F.cross_entropy(net(x), y)      # the rest of the step is compute
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    summary = mon.summary()
    if args.json:
        print(json.dumps(summary))
        return
    print(f"{summary['steps']} steps, median {1e3 * summary['step_time_s']['median']:.1f} ms: "
          f"data wait {summary['data_wait_fraction']:.0%}, copy {summary['copy_fraction']:.0%}, "
          f"compute {summary['compute_fraction']:.0%}")
    for f in summary["findings"]:
        print(f"- {f['kind']}: {f['evidence']}\n  fix: {f['fix']}")


if __name__ == "__main__":
    main()
