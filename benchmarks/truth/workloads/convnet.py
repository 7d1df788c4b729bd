"""A VGG-style CNN for 64x64 images (Tiny-ImageNet sized, 200 classes): four conv stages with
BatchNorm and max-pooling, then a small classifier. 4.8M parameters."""

import _common
from torch import nn
from torch.nn import functional as F

IMAGE, CLASSES = 64, 200


def _stage(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.MaxPool2d(2))


def model():
    return nn.Sequential(_stage(3, 64), _stage(64, 128), _stage(128, 256), _stage(256, 512),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, CLASSES))


def batch(batch_size):
    return _common.images(batch_size, IMAGE), _common.labels(batch_size, CLASSES)


def loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)
