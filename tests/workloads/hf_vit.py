"""ViT (vision transformer) for image classification from a tiny config."""

import _hf


def model():
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=128, num_labels=10)
    return ViTForImageClassification(cfg)


def batch(batch_size):
    return {"pixel_values": _hf.images(batch_size), "labels": _hf.labels(batch_size)}
