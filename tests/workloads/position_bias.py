"""Attention with a learned relative position bias passed to SDPA as its mask, made as T5 makes it: a
(q, k, heads) embedding permuted to (1, heads, q, k), whose last dimension has stride `heads`.
GPUWISE_TEST_BIAS_CONTIGUOUS=1 copies it first (as transformers 5.23 does; 5.17 did not)."""

import os

import torch
from torch import nn
from torch.nn import functional as F

SEQ, HEADS, HEAD_DIM = 256, 8, 64


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(HEADS * HEAD_DIM, 3 * HEADS * HEAD_DIM)
        self.bias = nn.Parameter(torch.zeros(SEQ, SEQ, HEADS))
        self.contiguous = os.environ.get("GPUWISE_TEST_BIAS_CONTIGUOUS") == "1"

    def forward(self, x):
        b = x.shape[0]
        q, k, v = (t.view(b, SEQ, HEADS, HEAD_DIM).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        bias = self.bias.permute(2, 0, 1).unsqueeze(0)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.contiguous() if self.contiguous else bias)


def model():
    return Net()


def batch(batch_size):
    return torch.randn(batch_size, SEQ, HEADS * HEAD_DIM, generator=torch.Generator().manual_seed(0))


def loss(model, batch):
    return model(batch).float().pow(2).mean()
