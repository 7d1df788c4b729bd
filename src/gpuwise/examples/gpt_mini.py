"""A small GPT in the style of nanoGPT (Karpathy, model.py): pre-LayerNorm blocks, causal
self-attention through `F.scaled_dot_product_attention`, tied embeddings. 6 layers, 6 heads,
384-wide, 256-token context, 8192-token vocabulary: 13.8M parameters.
"""

import math

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, CONTEXT, LAYERS, HEADS, WIDTH = 8192, 256, 6, 6, 384


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(WIDTH, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(WIDTH), CausalSelfAttention()
        self.ln2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.tok.weight  # weight tying, as GPT-2
        for m in self.modules():  # GPT-2 initialisation, as nanoGPT's _init_weights
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * LAYERS))

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def model() -> nn.Module:
    return GPT()


def batch(batch_size: int):
    g = torch.Generator().manual_seed(batch_size)
    tokens = torch.randint(0, VOCAB, (batch_size, CONTEXT + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def loss(model, batch):
    idx, targets = batch
    logits = model(idx)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class TokenChunks(torch.utils.data.Dataset):
    """Consecutive CONTEXT+1-token windows of a fixed random token stream (input, next-token target)."""

    def __init__(self, n_tokens: int = 200_000):
        self.stream = torch.randint(0, VOCAB, (n_tokens,), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return (len(self.stream) - 1) // CONTEXT

    def __getitem__(self, i):
        chunk = self.stream[i * CONTEXT: (i + 1) * CONTEXT + 1]
        return chunk[:-1], chunk[1:]


def dataset():
    return TokenChunks()
