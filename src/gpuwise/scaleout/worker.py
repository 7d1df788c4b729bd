"""The entry point torchrun starts on every rank: `python -m gpuwise.scaleout.worker JOB.json`.

JOB.json is {"mode": "train" | "scale", "config": {...}}; see `gpuwise.scaleout.train.TrainConfig` and
`gpuwise.scaleout.scale.ScaleConfig`. Rank 0 writes the result to the config's `result_path`.
"""

from __future__ import annotations

import json
import os
import sys

from .scale import ScaleConfig, measure_rank
from .train import TrainConfig, train


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m gpuwise.scaleout.worker JOB.json (started by torchrun)", file=sys.stderr)
        return 2
    with open(argv[0]) as fh:
        job = json.load(fh)
    if job["mode"] == "train":
        train(TrainConfig(**job["config"]))
    elif job["mode"] == "scale":
        measure_rank(ScaleConfig(**job["config"]))
    else:
        print(f"unknown mode {job['mode']!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The work is done and the result written: skip the interpreter's teardown. With gloo, a c10d
    # background thread still joinable when C++ statics are destroyed can abort the process
    # ("terminate called without an active exception"), which torchrun would report as a failed rank.
    os._exit(code)
