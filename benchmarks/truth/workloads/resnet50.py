"""CNN: ResNet-50 as published (He et al. 2016; `transformers` ResNetConfig defaults): bottleneck stages
of 3/4/6/3 blocks, 256/512/1024/2048 channels, BatchNorm; ResNetForImageClassification from the config
(random weights; torchvision has no CPU build on the development machines), 224x224 images, 1000 classes."""

import _common

IMAGE, CLASSES = 224, 1000


def model():
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig(depths=[3, 4, 6, 3], hidden_sizes=[256, 512, 1024, 2048], layer_type="bottleneck",
                       num_labels=CLASSES)
    return ResNetForImageClassification(cfg)


def batch(batch_size):
    return {"pixel_values": _common.images(batch_size, IMAGE), "labels": _common.labels(batch_size, CLASSES)}
