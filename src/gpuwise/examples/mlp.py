"""The seeds' fully connected net: batch 100, input 32, output 16.

Seed 000 adds its memory up by hand: 4 B * (100*32 input + 32*16 weights + 100*16 output) = 21,248 B
(it writes "20.75M"; it is 20.75 KiB), before gradients and optimizer state.
"""

import torch
from torch import nn
from torch.nn import functional as F

IN_FEATURES, OUT_FEATURES, DEFAULT_BATCH = 32, 16, 100


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(IN_FEATURES, OUT_FEATURES))


def batch(batch_size: int):
    g = torch.Generator().manual_seed(batch_size)
    x = torch.randn(batch_size, IN_FEATURES, generator=g)
    y = torch.randint(0, OUT_FEATURES, (batch_size,), generator=g)
    return x, y


def loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def dataset():
    x, y = batch(4096)
    return torch.utils.data.TensorDataset(x, y)
