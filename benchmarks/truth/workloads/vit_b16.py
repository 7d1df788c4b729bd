"""Vision transformer: ViT-B/16 as published (Dosovitskiy et al. 2021; `transformers` ViTConfig defaults):
224x224 images in 16x16 patches, 12 layers, 768 wide, 12 heads, 3072 FFN, 1000 classes;
ViTForImageClassification from the config (random weights)."""

import _common

IMAGE, CLASSES = 224, 1000


def model():
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(image_size=IMAGE, patch_size=16, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                    intermediate_size=3072, num_labels=CLASSES)
    return ViTForImageClassification(cfg)


def batch(batch_size):
    return {"pixel_values": _common.images(batch_size, IMAGE), "labels": _common.labels(batch_size, CLASSES)}
