"""CNN: ConvNeXt-T as published (Liu et al. 2022; `transformers` ConvNextConfig defaults): stages of
3/3/9/3 blocks, 96/192/384/768 channels, 7x7 depthwise convs, LayerNorm; ConvNextForImageClassification
from the config (random weights), 224x224 images, 1000 classes."""

import _common

IMAGE, CLASSES = 224, 1000


def model():
    from transformers import ConvNextConfig, ConvNextForImageClassification

    cfg = ConvNextConfig(depths=[3, 3, 9, 3], hidden_sizes=[96, 192, 384, 768], num_labels=CLASSES)
    return ConvNextForImageClassification(cfg)


def batch(batch_size):
    return {"pixel_values": _common.images(batch_size, IMAGE), "labels": _common.labels(batch_size, CLASSES)}
