"""litgpt's own model code as a gpuwise workload: `litgpt finetune adapter / adapter_v2 / lora` as its users
run it (lora: `litgpt.lora.GPT` with the config file's lora_* fields, `mark_only_lora_as_trainable`; its step
is finetune/lora.py's, the same as adapter.py's).

The model is litgpt's (`litgpt.adapter.GPT` / `litgpt.adapter_v2.GPT` from `Config.from_name(NAME)`), built
by gpuwise under fake tensors like any workload, with litgpt's own `mark_only_adapter_as_trainable` /
`mark_only_adapter_v2_as_trainable` and `model.max_seq_length` set to the longest sample, as
finetune/adapter.py does. The step is finetune/adapter.py's: `model(input_ids, lm_head_chunk_size=128)`,
the last chunk shifted, litgpt.utils.chunked_cross_entropy. Each step computes the adaption prefix's keys
and values afresh (litgpt 0.5.13 keeps them in `adapter_kv_cache`, an inference cache, even in training,
where a second step would backward through the first step's graph; the step clears it). Run with `--precision bf16-pure` (litgpt's
bf16-true: every parameter bf16).

`quantize` ("nf4", "nf4-dq"): litgpt's `--quantize bnb.*`, Lightning Fabric's BitsandbytesPrecision, which
replaces every nn.Linear the model builds (lm_head too) by a 4-bit layer quantized from a float16 copy:
gpuwise's `quantize_linear_4bit(keep_head=False, from_dtype=float16)` (bitsandbytes' own quantize_4bit,
under fake tensors). `bnb_version`: the release the run used (tracing/bnb_versions.py), applied to the step.

Needs litgpt (pip install litgpt --no-deps: its pins conflict with the huggingface_hub gpuwise is tested
with; the model code needs only torch and lightning).
"""

from __future__ import annotations

import importlib

MODULES = {"adapter": ("litgpt.adapter", "mark_only_adapter_as_trainable"),
           "adapter_v2": ("litgpt.adapter_v2", "mark_only_adapter_v2_as_trainable"),
           "lora": ("litgpt.lora", "mark_only_lora_as_trainable")}
LM_HEAD_CHUNK = 128   # finetune/adapter.py: model(input_ids, lm_head_chunk_size=128)
QUANTS = {"nf4": ("nf4", False), "nf4-dq": ("nf4", True)}


def workload(name: str, method: str, seq_len: int, quantize: str | None = None, bnb_version: str | None = None,
             **fields):
    """(model, batch, loss) functions for `litgpt finetune <method>` of checkpoint NAME at `seq_len` tokens;
    `fields`: Config fields the finetune file sets (lora: lora_r, lora_alpha, lora_dropout, lora_query, ...)."""
    import torch

    def model():
        mod_name, mark = MODULES[method]
        mod = importlib.import_module(mod_name)
        config = mod.Config.from_name(name, **fields)
        m = mod.GPT(config)
        m.max_seq_length = seq_len
        getattr(mod, mark)(m)
        if quantize is not None:
            from gpuwise.plan.tracing.modes import quantize_linear_4bit

            quant_type, double_quant = QUANTS[quantize]
            quantize_linear_4bit(m, compute_dtype=torch.bfloat16, quant_type=quant_type,
                                 double_quant=double_quant, keep_head=False, from_dtype=torch.float16)
        return m

    def batch(batch_size: int):
        ids = torch.randint(0, 32000, (batch_size, seq_len))
        return {"input_ids": ids, "labels": ids.clone()}

    def loss(model, batch):
        from litgpt.utils import chunked_cross_entropy

        from gpuwise.plan.tracing.bnb_versions import bitsandbytes_as

        for m in model.modules():  # the prefix's k/v are an inference cache: training recomputes them every step
            if getattr(m, "adapter_kv_cache", None) is not None:
                m.adapter_kv_cache = None
        with bitsandbytes_as(bnb_version):
            logits = model(batch["input_ids"], lm_head_chunk_size=LM_HEAD_CHUNK)
            logits[-1] = logits[-1][..., :-1, :]
            return chunked_cross_entropy(logits, batch["labels"][..., 1:])

    return model, batch, loss
