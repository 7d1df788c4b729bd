"""A wide MLP trained with AdamW: the optimizer step (weights, gradients, two states and foreach temporaries)
holds the peak at small batches, the activations at large ones (the bend is near 2,000 samples)."""

import torch
from torch import nn


def model():
    return nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))


def batch(n):
    return torch.randn(n, 512), torch.randint(0, 10, (n,))


def loss(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def optimizer(params):
    return torch.optim.AdamW(params)
