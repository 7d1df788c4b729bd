"""A plain training script as a user writes it: a Dataset that decodes each sample on the CPU (~5 ms),
a small CNN, a DataLoader, an optimizer. Nothing of gpuwise in it. `--workers N` sets num_workers."""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Decoded(Dataset):
    def __init__(self, n: int, work_s: float):
        self.n, self.work_s = n, work_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        end = time.thread_time() + self.work_s  # CPU work, like JPEG decoding and augmentation
        x = 0
        while time.thread_time() < end:
            x += 1
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, 32, 32, generator=g), i % 10


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--work-ms", type=float, default=5.0)
    p.add_argument("--width", type=int, default=16)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    w = args.width
    model = nn.Sequential(nn.Conv2d(3, w, 3, padding=1), nn.ReLU(), nn.Conv2d(w, w, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(w, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = Decoded(args.batch_size * args.steps, args.work_ms / 1e3)
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("done", float(loss))


if __name__ == "__main__":
    main()
