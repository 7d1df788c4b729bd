"""Small pure rules of the tuner: which precisions a device gets a trial for, and the learning-rate note."""

from __future__ import annotations

from typing import Any


def precision_candidates(device_type: str, info: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """(precisions worth a trial, {skipped precision: why}) for a device."""
    if device_type == "cuda":
        cands, skipped = ["fp32"], {}
        # TF32 and bf16 tensor cores arrived with Ampere, compute capability 8.0 (CUDA C programming guide)
        for p, ok, why in (("tf32", info.get("tf32"), "TF32 needs compute capability >= 8.0"),
                           ("bf16", info.get("bf16"), "bf16 needs compute capability >= 8.0"),
                           ("fp16", info.get("fp16", True), "")):
            if ok:
                cands.append(p)
            else:
                skipped[p] = why
        return cands, skipped
    skipped = {"tf32": "TF32 is a CUDA tensor-core mode; on the CPU it is fp32",
               "fp16": "fp16 autocast + GradScaler is a CUDA recipe; CPU fp16 is emulated and slower"}
    if device_type == "cpu" and info.get("cpu_bf16_native"):
        return ["fp32", "bf16"], skipped
    skipped["bf16"] = "this CPU has no native bf16 (AVX512-BF16/AMX): emulated bf16 is slower than fp32"
    return ["fp32"], skipped


def lr_note(old_batch: int, new_batch: int) -> str:
    """The learning-rate scaling rules for a batch change (Goyal et al. 2017 linear rule for SGD, with
    warm-up; square-root rule often used for Adam-family, Krizhevsky 2014 / Malladi et al. 2022)."""
    if old_batch == new_batch:
        return ""
    k = new_batch / old_batch
    return (f"batch {old_batch} -> {new_batch} (x{k:g}): scale the learning rate x{k:g} for SGD (linear rule, "
            f"with a few epochs of warm-up) or x{k ** 0.5:.2g} for Adam/AdamW (square-root rule), and re-check accuracy")
