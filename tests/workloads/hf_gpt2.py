"""GPT-2 (decoder) from a tiny transformers config, random weights."""

import _hf


def model():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=_hf.VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    return GPT2LMHeadModel(cfg)


def batch(batch_size):
    ids = _hf.tokens(batch_size)
    return {"input_ids": ids, "labels": ids}
