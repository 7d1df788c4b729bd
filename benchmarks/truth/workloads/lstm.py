"""An LSTM language model (Zaremba et al. 2014 "medium"-like): 10k vocabulary, 512-wide embedding,
2 LSTM layers of 1024, a softmax over the vocabulary at every one of 64 steps (cuDNN LSTM on GPU)."""

import _common
from torch import nn
from torch.nn import functional as F

VOCAB, EMBED, HIDDEN, SEQ = 10_000, 512, 1024, 64


class LstmLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, EMBED)
        self.rnn = nn.LSTM(EMBED, HIDDEN, num_layers=2, batch_first=True, dropout=0.1)
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, x):
        out, _ = self.rnn(self.emb(x))
        return self.head(out)


def model():
    return LstmLM()


def batch(batch_size):
    t = _common.tokens(batch_size, SEQ + 1, VOCAB)
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())
