"""Decoder with grouped-query attention, RoPE, SwiGLU and RMSNorm: `transformers` LlamaForCausalLM from a
config (random weights): 8 layers, 512 wide, 8 query / 4 key-value heads, 32000-token vocabulary,
512-token sequences."""

import _common

SEQ, VOCAB = 512, 32000


def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=SEQ)
    return LlamaForCausalLM(cfg)


def batch(batch_size):
    ids = _common.tokens(batch_size, SEQ, VOCAB)
    return {"input_ids": ids, "labels": ids}
