"""A ResNet-18 for 3x32x32 images (CIFAR-10 sized), written here: torchvision has no CPU build on
these machines. Layout as He et al. 2015 / Dive into Deep Learning 8.6: 3x3 stem, four stages of two
basic blocks (64, 128, 256, 512 channels), global average pooling, 10 classes. 11.2M parameters.
"""

import torch
from torch import nn
from torch.nn import functional as F

NUM_CLASSES, IMAGE = 10, 32


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.shortcut(x))


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = NUM_CLASSES):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        blocks, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def model() -> nn.Module:
    return ResNet18()


def batch(batch_size: int):
    g = torch.Generator().manual_seed(batch_size)
    x = torch.randn(batch_size, 3, IMAGE, IMAGE, generator=g)
    return x, torch.randint(0, NUM_CLASSES, (batch_size,), generator=g)


def loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def dataset():
    x, y = batch(2048)
    return torch.utils.data.TensorDataset(x, y)
