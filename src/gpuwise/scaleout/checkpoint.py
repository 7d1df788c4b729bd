"""Atomic training checkpoints: a restarted job resumes exactly where the last checkpoint was.

One file, `DIR/checkpoint.pt`, written by rank 0 as `checkpoint.pt.tmp` then `os.replace`d, so a
reader (a restarted job) sees the previous checkpoint or the new one, never half of one. It holds the
model (unwrapped from DDP), optimizer, GradScaler, the number of steps done, the sampler epoch, and
every rank's RNG states (gathered to rank 0), so the resumed job draws the same numbers.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Any

FILENAME = "checkpoint.pt"


def checkpoint_path(folder: str) -> str:
    return os.path.join(folder, FILENAME)


@dataclass
class Checkpoint:
    step: int                 # optimizer steps completed
    epoch: int                # DistributedSampler epoch in progress
    model: dict
    optimizer: dict
    scaler: dict | None
    rng: list[dict]           # one per rank
    world_size: int
    meta: dict


def rng_state() -> dict:
    import torch

    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:
        pass
    return state


def set_rng_state(state: dict) -> None:
    import torch

    # RNG states must be CPU ByteTensors; `load(map_location=cuda)` moved them to the GPU with the rest
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].cpu())
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])


def save(folder: str, ckpt: Checkpoint) -> str:
    """Write atomically (temp file + os.replace); returns the path."""
    import torch

    os.makedirs(folder, exist_ok=True)
    path = checkpoint_path(folder)
    tmp = f"{path}.tmp"
    torch.save(ckpt.__dict__, tmp)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def load(folder: str | None, map_location="cpu") -> Checkpoint | None:
    """The checkpoint in `folder`, or None when there is none yet."""
    import torch

    if not folder:
        return None
    path = checkpoint_path(folder)
    if not os.path.exists(path):
        return None
    data = torch.load(path, map_location=map_location, weights_only=False)
    return Checkpoint(**data)
