"""Hugging Face's published V100 table (transformers docs perf_train_gpu_one, early 2022; bert-large-uncased,
512 tokens, nvidia-smi used memory): its 9 settings as data, recomputed with the setting of their time
(eager attention, for-loop AdamW, gradients kept between steps, an eagerly loaded CUDA context)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks" / "published"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import corpus  # noqa: E402

SOURCE = "hf-perf-train-gpu-one"


def _rows(metric: str) -> list[dict]:
    return [r for r in corpus.load_rows() if r["source"]["name"] == SOURCE and r["metric"] == metric]


def test_the_nine_settings_are_there_with_the_setting_of_their_time():
    rows = _rows("nvidia_smi")
    assert len(rows) == 9 and len(_rows("samples_per_s")) == 9
    for row in rows:
        assert row["unit"] == "MiB" and f"GPU memory occupied: {row['value']} MB." in row["quote"]
        assert row["setting"]["attn"] == "eager" and row["setting"]["gpu"] == "V100-16GB"
        args = row["gpuwise_args"]
        for flag in ("--attn", "--zero-grad", "--module-loading"):
            assert flag in args
        assert args[args.index("--attn") + 1] == "eager"


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=(
    "-14.2 % since the CUDA-target trace saves dropout's 1-byte mask (native_dropout, as a GPU does; the H100 "
    "truth puts BERT-base and GPT-2 within 0.15 % with it, 3-6 % over with the old full-size noise tensor). The "
    "non-checkpointed bs4 rows of this 2022 V100 table now all miss by -10.5..-14.2 % (~1.6 GB, about what the "
    "24 layers' (4, 16, 512, 512) attention-dropout noise tensors held), the checkpointed ones stay within "
    "0.8 %: those runs held something that noise tensor offset, not found (docs/cuda-target.md, Dropout)"))
def test_fp16_row_within_8_percent_of_nvidia_smi():
    """The row that CUDA's autocast policy decides (softmax / layer_norm outputs kept in fp32)."""
    import published_memory

    row = next(r for r in _rows("nvidia_smi") if r["id"].endswith("-bs4-fp16-nvidia-smi"))
    rec = published_memory.run_row(row)
    assert "error" not in rec, rec.get("error")
    assert abs(rec["err_pct"]) <= 8.0, rec
