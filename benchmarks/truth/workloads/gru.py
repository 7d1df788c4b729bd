"""A text classifier: 20k-token embedding (256), a 2-layer bidirectional GRU of 512 over 256 tokens,
mean-pooled, 5 classes (Yelp-review sized)."""

import _common
from torch import nn
from torch.nn import functional as F

VOCAB, EMBED, HIDDEN, SEQ, CLASSES = 20_000, 256, 512, 256, 5


class GruClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, EMBED)
        self.rnn = nn.GRU(EMBED, HIDDEN, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * HIDDEN, CLASSES)

    def forward(self, x):
        out, _ = self.rnn(self.emb(x))
        return self.head(out.mean(dim=1))


def model():
    return GruClassifier()


def batch(batch_size):
    return _common.tokens(batch_size, SEQ, VOCAB), _common.labels(batch_size, CLASSES)


def loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)
