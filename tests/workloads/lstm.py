"""A recurrent net: embedding, 2-layer LSTM, linear head over the last step."""

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, WIDTH, SEQ = 64, 32, 12


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.rnn = nn.LSTM(WIDTH, WIDTH, num_layers=2, batch_first=True)
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x):
        out, _ = self.rnn(self.emb(x))
        return self.head(out[:, -1])


def model():
    return Net()


def batch(batch_size):
    g = torch.Generator().manual_seed(batch_size)
    return torch.randint(0, VOCAB, (batch_size, SEQ), generator=g), torch.randint(0, 10, (batch_size,), generator=g)


def loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)
