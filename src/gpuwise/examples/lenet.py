"""LeNet-5 as in the seeds' Fashion-MNIST run (Dive into Deep Learning, chapter "GPUs"/"LeNet").

Input 1x28x28, sigmoid activations and average pooling, 10 classes. The dataset is synthetic
Fashion-MNIST-shaped data (no downloads on these machines): 28x28 uint8 images, converted in the
Dataset's __getitem__ as torchvision's ToTensor would.
"""

import torch
from torch import nn
from torch.nn import functional as F


def model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 6, kernel_size=5, padding=2), nn.Sigmoid(), nn.AvgPool2d(kernel_size=2, stride=2),
        nn.Conv2d(6, 16, kernel_size=5), nn.Sigmoid(), nn.AvgPool2d(kernel_size=2, stride=2),
        nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120), nn.Sigmoid(),
        nn.Linear(120, 84), nn.Sigmoid(),
        nn.Linear(84, 10),
    )


def batch(batch_size: int):
    g = torch.Generator().manual_seed(batch_size)
    return torch.rand(batch_size, 1, 28, 28, generator=g), torch.randint(0, 10, (batch_size,), generator=g)


def loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


class FashionLike(torch.utils.data.Dataset):
    """60,000 deterministic 28x28 uint8 images and labels, scaled to [0, 1] floats on access."""

    def __init__(self, n: int = 60_000):
        g = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, 10, (n,), generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i].unsqueeze(0).float().div_(255), self.labels[i]


def dataset():
    return FashionLike()
