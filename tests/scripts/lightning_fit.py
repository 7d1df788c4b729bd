"""A Lightning script as a user writes it: a LightningModule, a DataLoader over a Dataset that decodes
on the CPU (~5 ms per sample), Trainer.fit(). Nothing of gpuwise in it."""

import argparse
import time

import lightning as L
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
        while time.thread_time() < end:
            pass
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, 32, 32, generator=g), i % 10


class Net(L.LightningModule):
    def __init__(self, width: int, workers: int, batch_size: int, steps: int):
        super().__init__()
        self.width, self.workers, self.batch_size, self.steps = width, workers, batch_size, steps
        self.net = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1),
                                 nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(Decoded(self.batch_size * self.steps, 0.005), batch_size=self.batch_size,
                          num_workers=self.workers, shuffle=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=16)
    args = p.parse_args()
    torch.set_num_threads(1)
    trainer = L.Trainer(max_steps=args.steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Net(args.width, args.workers, args.batch_size, args.steps))


if __name__ == "__main__":
    main()
