"""A model whose forward has data-dependent operations: `.item()`, a `torch.all` check, `nonzero`."""

import torch
from torch import nn
from torch.nn import functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))
        if not torch.all(torch.isfinite(h)):  # a data-dependent check, as models do
            raise ValueError("non-finite activations")
        scale = h.abs().max().item()  # .item()
        keep = (h.sum(dim=1) > -1).nonzero().squeeze(1)  # a dynamic shape
        return self.b(h[keep] / (scale + 1.0))


def model():
    return Net()


def batch(batch_size):
    g = torch.Generator().manual_seed(batch_size)
    return torch.randn(batch_size, 16, generator=g), torch.randint(0, 4, (batch_size,), generator=g)


def loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)
