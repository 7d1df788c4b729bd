"""Alpaca's training-sample lengths as litgpt's resource-table runs saw them: a length file for
`gpuwise estimate --seq-len-dist` (docs/contracts.md, *Length files*).

litgpt at 8641822 (the resource tables' commit), scripts/prepare_alpaca.py: the data file
`alpaca_data_cleaned_archive.json` of tloen/alpaca-lora (downloaded from its main branch), split by
`torch.utils.data.random_split(data, [1 - 0.03865, 0.03865], generator=torch.Generator().manual_seed(42))`
(2000 test samples), each training sample encoded as `tokenizer.encode(prompt + output, eos=True,
max_length=block_size)` with the checkpoint's tokenizer (`lit_gpt.tokenizer.Tokenizer`, vendored unchanged
in workloads/_lit_gpt_8641822/) and the Alpaca prompt (the two templates below, as prepare_alpaca.py's
`generate_prompt` writes them). finetune/lora.py pads each micro-batch to its longest sample and takes
`max(lengths)` as the longest (the tables state it per model: phi-1.5 1044, StableLM Alpha 1034, Llama 2
1304, Falcon 1079); `--expect-longest` checks that, so a file is written only where the tokenization
reproduces the stated maximum.

    python benchmarks/published/alpaca_lengths.py alpaca_data_cleaned_archive.json CHECKPOINT_DIR \\
        --expect-longest 1044 --block-size 2048 --label "phi-1.5 (microsoft/phi-1_5 tokenizer.json @ REV)" \\
        -o benchmarks/published/lengths/alpaca-phi-1_5.txt

CHECKPOINT_DIR holds the tokenizer files litgpt's Tokenizer reads (tokenizer.model, or tokenizer.json with
tokenizer_config.json / generation_config.json). Only the derived histogram is meant to be committed, with
its sources in its header, never the dataset.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEST_SPLIT_FRACTION = 0.03865  # prepare_alpaca.py at 8641822: "to get exactly 2000 test samples"
SEED = 42

WITH_INPUT = ("Below is an instruction that describes a task, paired with an input that provides further context. "
              "Write a response that appropriately completes the request.\n\n"
              "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:")
WITHOUT_INPUT = ("Below is an instruction that describes a task. "
                 "Write a response that appropriately completes the request.\n\n"
                 "### Instruction:\n{instruction}\n\n### Response:")


def prompt(example: dict) -> str:
    """prepare_alpaca.py's generate_prompt at 8641822 (the template with an input when there is one)."""
    template = WITH_INPUT if example["input"] else WITHOUT_INPUT
    return template.format(instruction=example["instruction"], input=example["input"])


def train_split(data: list) -> list:
    """The training samples prepare_alpaca.py keeps (random_split with its fractions and seed)."""
    import torch
    from torch.utils.data import random_split

    train, _ = random_split(data, [1.0 - TEST_SPLIT_FRACTION, TEST_SPLIT_FRACTION],
                            generator=torch.Generator().manual_seed(SEED))
    return list(train)


def tokenizer(checkpoint_dir: Path):
    """litgpt's own Tokenizer at 8641822 (vendored unchanged)."""
    here = str(HERE / "workloads" / "_lit_gpt_8641822")
    if here not in sys.path:
        sys.path.insert(0, here)
    from lit_gpt.tokenizer import Tokenizer

    return Tokenizer(Path(checkpoint_dir))


def lengths(data: list, checkpoint_dir: Path, block_size: int = -1) -> list[int]:
    """Each training sample's token count: prompt + response + EOS, cut at `block_size` (> 0)."""
    tok = tokenizer(checkpoint_dir)
    return [len(tok.encode(prompt(ex) + ex["output"], eos=True, max_length=block_size)) for ex in train_split(data)]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write(out: Path, lens: list[int], header: list[str]) -> None:
    hist: dict[int, int] = {}
    for n in lens:
        hist[n] = hist.get(n, 0) + 1
    body = [f"# {h}" for h in header] + ["# LENGTH COUNT"] + [f"{k} {hist[k]}" for k in sorted(hist)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(body) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", type=Path, help="alpaca_data_cleaned_archive.json (tloen/alpaca-lora)")
    p.add_argument("checkpoint_dir", type=Path, help="the model's tokenizer files, as litgpt's checkpoint dir")
    p.add_argument("-o", "--out", type=Path, required=True)
    p.add_argument("--block-size", type=int, default=-1, help="the model's block_size (lit_config.json): the cut")
    p.add_argument("--expect-longest", type=int, help="the longest sample the source states: refuse otherwise")
    p.add_argument("--label", default="", help="the tokenizer's source (repository, revision), for the header")
    args = p.parse_args(argv)
    try:
        data = json.loads(args.data.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"alpaca_lengths: {args.data}: {exc}", file=sys.stderr)
        return 2
    lens = lengths(data, args.checkpoint_dir, args.block_size)
    if args.expect_longest is not None and max(lens) != args.expect_longest:
        print(f"alpaca_lengths: the longest training sample is {max(lens)} tokens, the source states "
              f"{args.expect_longest}: the tokenization does not reproduce it; no file written", file=sys.stderr)
        return 1
    tok_files = sorted(f for f in args.checkpoint_dir.iterdir() if f.is_file())
    write(args.out, lens, [
        f"Alpaca training-sample lengths (tokens) as litgpt 8641822's prepare_alpaca.py + finetune/lora.py see them "
        f"({len(lens)} samples, longest {max(lens)})",
        f"data: {args.data.name} sha256 {sha256(args.data)} (tloen/alpaca-lora, main)",
        f"split: random_split([1 - {TEST_SPLIT_FRACTION}, {TEST_SPLIT_FRACTION}], seed {SEED}); block_size cut "
        f"{args.block_size}",
        f"tokenizer: {args.label}; " + ", ".join(f"{f.name} sha256 {sha256(f)[:16]}" for f in tok_files),
        "made by: benchmarks/published/alpaca_lengths.py"])
    print(f"{args.out}: {len(lens)} samples, longest {max(lens)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
