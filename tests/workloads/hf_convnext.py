"""ConvNeXt (CNN) for image classification from a tiny config."""

import _hf


def model():
    from transformers import ConvNextConfig, ConvNextForImageClassification

    cfg = ConvNextConfig(num_channels=3, hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, num_labels=10)
    return ConvNextForImageClassification(cfg)


def batch(batch_size):
    return {"pixel_values": _hf.images(batch_size), "labels": _hf.labels(batch_size)}
