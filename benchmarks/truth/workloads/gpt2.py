"""Decoder: `transformers` GPT2LMHeadModel from a config (random weights): 6 layers, 768 wide, 12 heads,
50257-token vocabulary, 512-token sequences (a half-depth GPT-2 small)."""

import _common

SEQ, VOCAB = 512, 50257


def model():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=768, n_layer=6, n_head=12)
    return GPT2LMHeadModel(cfg)


def batch(batch_size):
    ids = _common.tokens(batch_size, SEQ, VOCAB)
    return {"input_ids": ids, "labels": ids}
