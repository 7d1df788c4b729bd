"""Synthetic inputs shared by the truth-corpus workloads (random, seeded by the batch size: reproducible)."""

import torch


def tokens(batch_size: int, seq: int, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(batch_size * 7919 + seed)
    return torch.randint(0, vocab, (batch_size, seq), generator=g)


def images(batch_size: int, size: int, channels: int = 3):
    g = torch.Generator().manual_seed(batch_size)
    return torch.randn(batch_size, channels, size, size, generator=g)


def labels(batch_size: int, classes: int, seed: int = 1):
    g = torch.Generator().manual_seed(batch_size + seed)
    return torch.randint(0, classes, (batch_size,), generator=g)
