"""An HF `transformers.Trainer` script as a user writes it: a tiny BERT built from its config, a Dataset
that "tokenizes" on the CPU (~5 ms per sample), Trainer.train(). Nothing of gpuwise in it."""

import argparse
import sys
import tempfile
import time

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class Tokenized(Dataset):
    def __init__(self, n: int, work_s: float, seq: int = 32):
        self.n, self.work_s, self.seq = n, work_s, seq

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        end = time.thread_time() + self.work_s  # CPU work, like tokenizing raw text
        while time.thread_time() < end:
            pass
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(5, 100, (self.seq,), generator=g)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.tensor(i % 2)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--hidden", type=int, default=32)
    args = p.parse_args()
    torch.set_num_threads(1)
    config = BertConfig(vocab_size=100, hidden_size=args.hidden, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=2 * args.hidden, max_position_embeddings=64, num_labels=2)
    model = BertForSequenceClassification(config)
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(output_dir=out, per_device_train_batch_size=16, max_steps=args.steps,
                                     dataloader_num_workers=args.workers, report_to=[], save_strategy="no",
                                     logging_strategy="no", use_cpu=True, disable_tqdm=True)
        Trainer(model=model, args=training, train_dataset=Tokenized(16 * args.steps, 0.005)).train()
    print("trained", file=sys.stderr)


if __name__ == "__main__":
    main()
