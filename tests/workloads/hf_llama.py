"""Llama (decoder with RoPE, RMSNorm, SwiGLU, grouped-query attention) from a tiny config."""

import _hf


def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=_hf.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg)


def batch(batch_size):
    ids = _hf.tokens(batch_size)
    return {"input_ids": ids, "labels": ids}
