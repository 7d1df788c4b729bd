"""An embedding-heavy recommender in the style of DLRM (Naumov et al. 2019): 8 categorical features,
each a 500k x 64 embedding table (256M parameters, 1 GiB in fp32), 13 dense features through a
bottom MLP, pairwise dot-product interactions, a top MLP and a click probability."""

import torch
from torch import nn
from torch.nn import functional as F

TABLES, ROWS, DIM, DENSE = 8, 500_000, 64, 13


class Dlrm(nn.Module):
    def __init__(self):
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(ROWS, DIM) for _ in range(TABLES))
        self.bottom = nn.Sequential(nn.Linear(DENSE, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                                    nn.Linear(256, DIM), nn.ReLU())
        pairs = (TABLES + 1) * TABLES // 2
        self.top = nn.Sequential(nn.Linear(DIM + pairs, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(),
                                 nn.Linear(512, 1))

    def forward(self, dense, sparse):
        x = self.bottom(dense)
        feats = torch.stack([x] + [t(sparse[:, i]) for i, t in enumerate(self.tables)], dim=1)
        inter = feats @ feats.transpose(1, 2)
        i, j = torch.triu_indices(TABLES + 1, TABLES + 1, offset=1, device=dense.device)
        return self.top(torch.cat([x, inter[:, i, j]], dim=1)).squeeze(1)


def model():
    return Dlrm()


def batch(batch_size):
    g = torch.Generator().manual_seed(batch_size)
    dense = torch.randn(batch_size, DENSE, generator=g)
    sparse = torch.randint(0, ROWS, (batch_size, TABLES), generator=g)
    clicks = torch.randint(0, 2, (batch_size,), generator=g).float()
    return dense, sparse, clicks


def loss(model, batch):
    dense, sparse, clicks = batch
    return F.binary_cross_entropy_with_logits(model(dense, sparse), clicks)
