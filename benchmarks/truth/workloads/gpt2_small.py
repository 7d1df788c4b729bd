"""Decoder: GPT-2 small as published (Radford et al. 2019; `transformers` GPT2Config defaults): 12 layers,
768 wide, 12 heads, 50257-token vocabulary, 1024-token sequences; GPT2LMHeadModel from the config
(random weights, tied embeddings)."""

import _common

SEQ, VOCAB = 1024, 50257


def model():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=768, n_layer=12, n_head=12)
    return GPT2LMHeadModel(cfg)


def batch(batch_size):
    ids = _common.tokens(batch_size, SEQ, VOCAB)
    return {"input_ids": ids, "labels": ids}
