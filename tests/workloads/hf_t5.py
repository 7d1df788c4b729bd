"""T5 (encoder-decoder) from a tiny config."""

import _hf


def model():
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(vocab_size=_hf.VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
                   num_heads=4, decoder_start_token_id=0, pad_token_id=0)
    return T5ForConditionalGeneration(cfg)


def batch(batch_size):
    return {"input_ids": _hf.tokens(batch_size), "labels": _hf.tokens(batch_size, seq=8, seed=7)}
