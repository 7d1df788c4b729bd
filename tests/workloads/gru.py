"""A recurrent net with a GRU cell loop written out by hand (nn.GRUCell over time steps)."""

import torch
from torch import nn
from torch.nn import functional as F

WIDTH, SEQ = 24, 10


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(8, WIDTH)
        self.head = nn.Linear(WIDTH, 5)

    def forward(self, x):
        h = torch.zeros(x.shape[0], WIDTH)
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h)
        return self.head(h)


def model():
    return Net()


def batch(batch_size):
    g = torch.Generator().manual_seed(batch_size)
    return torch.randn(batch_size, SEQ, 8, generator=g), torch.randint(0, 5, (batch_size,), generator=g)


def loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)
