"""Shared helpers for the `transformers` test workloads: tiny configs, random weights, no downloads."""

import torch

SEQ = 16
VOCAB = 128


def tokens(batch_size: int, seq: int = SEQ, vocab: int = VOCAB, seed: int = 0):
    g = torch.Generator().manual_seed(batch_size + seed)
    return torch.randint(0, vocab, (batch_size, seq), generator=g)


def images(batch_size: int, size: int = 32, channels: int = 3):
    g = torch.Generator().manual_seed(batch_size)
    return torch.rand(batch_size, channels, size, size, generator=g)


def labels(batch_size: int, classes: int = 10):
    g = torch.Generator().manual_seed(batch_size + 1)
    return torch.randint(0, classes, (batch_size,), generator=g)
