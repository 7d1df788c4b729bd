"""BERT (encoder) for sequence classification from a tiny config."""

import _hf


def model():
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(vocab_size=_hf.VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64, num_labels=10)
    return BertForSequenceClassification(cfg)


def batch(batch_size):
    return {"input_ids": _hf.tokens(batch_size), "labels": _hf.labels(batch_size)}
