"""A ~1B decoder at Llama-3.2-1B's published widths (its config.json): 16 layers, 2048 wide, 32 query /
8 key-value heads, 8192 SwiGLU, 128256-token vocabulary, tied embeddings (1.24B parameters);
LlamaForCausalLM from the config (random weights), 1024-token sequences."""

import _common

SEQ, VOCAB = 1024, 128256


def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=SEQ,
                      rope_theta=500000.0, tie_word_embeddings=True, rms_norm_eps=1e-5)
    return LlamaForCausalLM(cfg)


def batch(batch_size):
    ids = _common.tokens(batch_size, SEQ, VOCAB)
    return {"input_ids": ids, "labels": ids}
