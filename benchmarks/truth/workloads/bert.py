"""Encoder: `transformers` BertForMaskedLM from a config (random weights): 8 layers, 512 wide, 8 heads,
2048 FFN, 30522-token vocabulary, 128-token sequences; 15% of positions carry a label."""

import _common
import torch

SEQ, VOCAB = 128, 30522


def model():
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(vocab_size=VOCAB, hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                     intermediate_size=2048, max_position_embeddings=SEQ)
    return BertForMaskedLM(cfg)


def batch(batch_size):
    ids = _common.tokens(batch_size, SEQ, VOCAB)
    g = torch.Generator().manual_seed(batch_size + 3)
    labels = torch.where(torch.rand(batch_size, SEQ, generator=g) < 0.15, ids, torch.full_like(ids, -100))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
