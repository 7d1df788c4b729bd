"""Encoder-decoder: `transformers` T5ForConditionalGeneration from a config (random weights): 6 + 6
layers, 512 wide, 8 heads, 2048 FFN, 32128-token vocabulary; 256 input and 64 target tokens (t5-small)."""

import _common

SRC, TGT, VOCAB = 256, 64, 32128


def model():
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(vocab_size=VOCAB, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_decoder_layers=6,
                   num_heads=8, decoder_start_token_id=0, pad_token_id=0)
    return T5ForConditionalGeneration(cfg)


def batch(batch_size):
    return {"input_ids": _common.tokens(batch_size, SRC, VOCAB),
            "labels": _common.tokens(batch_size, TGT, VOCAB, seed=7)}
