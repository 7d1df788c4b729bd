"""Encoder: BERT-base as published (Devlin et al. 2019; `transformers` BertConfig defaults): 12 layers,
768 wide, 12 heads, 3072 FFN, 30522-token vocabulary; BertForMaskedLM from the config (random weights),
512-token sequences, 15% of positions carry a label."""

import _common
import torch

SEQ, VOCAB = 512, 30522


def model():
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(vocab_size=VOCAB, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                     intermediate_size=3072, max_position_embeddings=SEQ)
    return BertForMaskedLM(cfg)


def batch(batch_size):
    ids = _common.tokens(batch_size, SEQ, VOCAB)
    g = torch.Generator().manual_seed(batch_size + 3)
    labels = torch.where(torch.rand(batch_size, SEQ, generator=g) < 0.15, ids, torch.full_like(ids, -100))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
