"""An `accelerate` script as a user writes it: Accelerator().prepare(model, optimizer, loader),
accelerator.backward(loss); a Dataset that decodes on the CPU (~5 ms per sample). Nothing of gpuwise."""

import argparse
import time

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Decoded(Dataset):
    def __len__(self):
        return 16 * 8

    def __getitem__(self, i):
        end = time.thread_time() + 0.005
        while time.thread_time() < end:
            pass
        return torch.randn(3, 32, 32), i % 10


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(16, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Decoded(), batch_size=16, num_workers=args.workers)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    main()
