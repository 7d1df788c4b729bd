"""A data-bound image workload: a folder of JPEGs decoded with PIL and augmented in the Dataset.

The images are generated on first use (no downloads on these machines) into
`$GPUWISE_CACHE/imagefolder-<n>-<size>` (default cache `~/.cache/gpuwise`), laid out like
torchvision's ImageFolder (`class_<k>/<i>.jpg`), atomically: written into a temporary folder that is
renamed into place, so a killed or concurrent first use never leaves a half-written folder.

`__getitem__` does what a torchvision ImageNet pipeline does, written with PIL/numpy/torch (there is no
torchvision build here): decode, RandomResizedCrop (scale 0.08-1, ratio 3/4-4/3, torchvision's
defaults), horizontal flip, to tensor, normalise (ImageNet mean/std). The CNN is small, so on a CPU
the step waits on JPEG decoding and `num_workers` matters; `GPUWISE_IMAGEFOLDER_N` sets the number of
images (tests use a few dozen).
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile

import torch
from torch import nn
from torch.nn import functional as F

N_IMAGES = 1024          # default number of images (GPUWISE_IMAGEFOLDER_N overrides)
IMAGE_SIZE = 256         # side of the stored JPEGs, pixels
CROP_SIZE = 64           # side of the augmented crop fed to the model
N_CLASSES = 10
JPEG_QUALITY = 90
# torchvision.transforms.Normalize values used for ImageNet (torchvision/models docs)
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def cache_root() -> str:
    return os.environ.get("GPUWISE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "gpuwise")


def n_images() -> int:
    return int(os.environ.get("GPUWISE_IMAGEFOLDER_N", N_IMAGES))


def _make_image(i: int, size: int):
    """A deterministic, JPEG-realistic picture: class-coloured gradient, a disc and sensor-like noise."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(i)
    label = i % N_CLASSES
    hue = np.array([math.cos(label), math.cos(label + 2.1), math.cos(label + 4.2)]) * 80 + 128
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    angle = rng.uniform(0, 2 * math.pi)
    ramp = (np.cos(angle) * xx + np.sin(angle) * yy)[..., None] * 90
    img = hue + ramp + rng.normal(0, 20, (size, size, 3))
    cy, cx, r = rng.uniform(0.2, 0.8, 2).tolist() + [rng.uniform(0.1, 0.3)]
    disc = ((yy - cy) ** 2 + (xx - cx) ** 2) < r * r
    img[disc] = 255 - hue
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)), label


def ensure_images(n: int | None = None, size: int = IMAGE_SIZE, root: str | None = None) -> str:
    """The folder of `n` generated JPEGs, created on first use (atomically); returns its path."""
    n = n or n_images()
    root = root or cache_root()
    final = os.path.join(root, f"imagefolder-{n}-{size}")
    if os.path.isdir(final):
        return final
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-imagefolder-", dir=root)
    try:
        for k in range(N_CLASSES):
            os.makedirs(os.path.join(tmp, f"class_{k}"))
        for i in range(n):
            img, label = _make_image(i, size)
            img.save(os.path.join(tmp, f"class_{label}", f"{i:06d}.jpg"), quality=JPEG_QUALITY)
        try:
            os.rename(tmp, final)
        except OSError:  # another process finished first: keep theirs
            if not os.path.isdir(final):
                raise
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def random_resized_crop_box(width: int, height: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """(left, top, right, bottom) as torchvision's RandomResizedCrop.get_params draws it (torch RNG,
    so DataLoader workers get distinct streams)."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * float(torch.empty(1).uniform_(scale[0], scale[1]))
        aspect = math.exp(float(torch.empty(1).uniform_(*log_ratio)))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            left = int(torch.randint(0, width - w + 1, (1,)))
            top = int(torch.randint(0, height - h + 1, (1,)))
            return left, top, left + w, top + h
    side = min(width, height)  # fallback: centre crop
    left, top = (width - side) // 2, (height - side) // 2
    return left, top, left + side, top + side


class ImageFolder(torch.utils.data.Dataset):
    """`class_<k>/*.jpg` files -> (3 x crop x crop float tensor, label), decoded and augmented per access."""

    def __init__(self, root: str, crop: int = CROP_SIZE):
        self.crop = crop
        self.samples = []
        for k in range(N_CLASSES):
            folder = os.path.join(root, f"class_{k}")
            self.samples += [(os.path.join(folder, f), k) for f in sorted(os.listdir(folder))]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        import numpy as np
        from PIL import Image

        path, label = self.samples[i]
        with Image.open(path) as im:
            im = im.convert("RGB")
        box = random_resized_crop_box(*im.size)
        im = im.resize((self.crop, self.crop), Image.BILINEAR, box=box)
        if float(torch.rand(1)) < 0.5:
            im = im.transpose(Image.FLIP_LEFT_RIGHT)
        arr = np.asarray(im, dtype=np.float32) / 255.0
        arr = (arr - np.asarray(MEAN, dtype=np.float32)) / np.asarray(STD, dtype=np.float32)
        return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1))), label


def model() -> nn.Module:
    """A small CNN (three strided 3x3 convolutions): cheap next to the JPEG decoding."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, N_CLASSES),
    )


def batch(batch_size: int):
    g = torch.Generator().manual_seed(batch_size)
    x = torch.randn(batch_size, 3, CROP_SIZE, CROP_SIZE, generator=g)
    return x, torch.randint(0, N_CLASSES, (batch_size,), generator=g)


def loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def dataset() -> ImageFolder:
    return ImageFolder(ensure_images())
