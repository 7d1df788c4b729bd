"""GPT-2 small (124M parameters: 12 layers, 768 wide, 12 heads), 256-token sequences, random weights."""

import torch


def model():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config())


def batch(batch_size):
    g = torch.Generator().manual_seed(batch_size)
    ids = torch.randint(0, 50257, (batch_size, 256), generator=g)
    return {"input_ids": ids, "labels": ids}
