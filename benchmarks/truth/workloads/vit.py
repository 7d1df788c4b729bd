"""Vision transformer: `transformers` ViTForImageClassification from a config (random weights), ViT-S/16:
224x224 images in 16x16 patches, 12 layers, 384 wide, 6 heads, 1000 classes."""

import _common

IMAGE, CLASSES = 224, 1000


def model():
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(image_size=IMAGE, patch_size=16, hidden_size=384, num_hidden_layers=12, num_attention_heads=6,
                    intermediate_size=1536, num_labels=CLASSES)
    return ViTForImageClassification(cfg)


def batch(batch_size):
    return {"pixel_values": _common.images(batch_size, IMAGE), "labels": _common.labels(batch_size, CLASSES)}
