"""litgpt's own model code as a gpuwise workload: `litgpt finetune adapter / adapter_v2 / lora / full` as its
users run it (lora: `litgpt.lora.GPT` with the config file's lora_* fields, `mark_only_lora_as_trainable`; its
step is finetune/lora.py's, the same as adapter.py's; full: `litgpt.model.GPT`, every parameter trained,
finetune/full.py's step: `model(input_ids)`, the whole logits, `chunked_cross_entropy(logits[..., :-1, :], ...)`).

The model is litgpt's (`litgpt.adapter.GPT` / `litgpt.adapter_v2.GPT` from `Config.from_name(NAME)`), built
by gpuwise under fake tensors like any workload, with litgpt's own `mark_only_adapter_as_trainable` /
`mark_only_adapter_v2_as_trainable` and `model.max_seq_length` set to the longest sample, as
finetune/adapter.py does. The step is finetune/adapter.py's: `model(input_ids, lm_head_chunk_size=128)`,
the last chunk shifted, litgpt.utils.chunked_cross_entropy, with the logits as the script gets them back from
its Fabric-wrapped model: cast to float32 (`fabric_output`). Each step computes the adaption prefix's keys
and values afresh (litgpt 0.5.13 keeps them in `adapter_kv_cache`, an inference cache, even in training,
where a second step would backward through the first step's graph; the step clears it). Run with `--precision bf16-pure` (litgpt's
bf16-true: every parameter bf16).

`quantize` ("nf4", "nf4-dq"): litgpt's `--quantize bnb.*`, Lightning Fabric's BitsandbytesPrecision, which
replaces every nn.Linear the model builds (lm_head too) by a 4-bit layer quantized from a float16 copy:
gpuwise's `quantize_linear_4bit(keep_head=False, from_dtype=float16)` (bitsandbytes' own quantize_4bit,
under fake tensors). `bnb_version`: the release the run used (tracing/bnb_versions.py), applied to the step.

`package="lit_gpt"`: the same with litgpt's code as it was at commit 8641822 (October 2023; the resource
tables' runs), vendored unchanged in `_lit_gpt_8641822/`; its LoRA Config fields are `r`, `alpha`, `dropout`,
`to_query`, ... instead of `lora_*`.

Needs litgpt (pip install litgpt --no-deps: its pins conflict with the huggingface_hub gpuwise is tested
with; the model code needs only torch and lightning).
"""

from __future__ import annotations

import importlib

MODULES = {"adapter": ("adapter", "mark_only_adapter_as_trainable"),
           "adapter_v2": ("adapter_v2", "mark_only_adapter_v2_as_trainable"),
           "lora": ("lora", "mark_only_lora_as_trainable"),
           "full": ("model", None)}  # finetune/full.py: litgpt.model.GPT, every parameter trained
LM_HEAD_CHUNK = 128   # finetune/adapter.py: model(input_ids, lm_head_chunk_size=128)
QUANTS = {"nf4": ("nf4", False), "nf4-dq": ("nf4", True)}


def fabric_output(logits):
    """What the finetune script gets back from its Fabric-wrapped model: `_FabricModule.forward` ends with
    `precision.convert_output(output)`, which casts every floating tensor of the output to
    `torch.get_default_dtype()` -- float32, outside the forward's dtype context -- for bf16-true
    (`HalfPrecision`), under FSDP (`FSDPPrecision`) and for `--quantize bnb.*` (`BitsandbytesPrecision`)
    alike (lightning/fabric/wrappers.py and plugins/precision/*.py, at the Lightning commit litgpt 8641822
    pins, 71aed751, and in 2.6). So the bf16 logit chunks become float32 copies (the bf16 ones are freed:
    `_to_copy`'s backward keeps nothing), and chunked_cross_entropy's log-softmax runs, and is saved, in
    float32: twice the logits' bf16 bytes more than the bare model's step."""
    import torch

    def cast(t):
        return t.to(torch.float32) if isinstance(t, torch.Tensor) and t.is_floating_point() else t

    return [cast(t) for t in logits] if isinstance(logits, (list, tuple)) else cast(logits)


def workload(name: str, method: str, seq_len: int, quantize: str | None = None, bnb_version: str | None = None,
             package: str = "litgpt", **fields):
    """(model, batch, loss) functions for `litgpt finetune <method>` of checkpoint NAME at `seq_len` tokens;
    `fields`: Config fields the finetune file sets (lora: lora_r, lora_alpha, lora_dropout, lora_query, ...).
    `package`: the model code's package, "litgpt" (the installed release) or "lit_gpt" (litgpt as it was in
    October 2023, `lit_gpt/` at commit 8641822, kept in `_lit_gpt_8641822/`: the resource tables' code)."""
    import torch

    if package == "lit_gpt":
        import os
        import sys

        here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_lit_gpt_8641822")
        if here not in sys.path:
            sys.path.insert(0, here)

    def model():
        mod_name, mark = MODULES[method]
        mod = importlib.import_module(f"{package}.{mod_name}")
        config = mod.Config.from_name(name, **fields)
        m = mod.GPT(config)
        m.max_seq_length = seq_len
        if mark is not None:
            getattr(mod, mark)(m)
        if quantize is not None:
            from gpuwise.plan.tracing.quant4bit import quantize_linear_4bit

            quant_type, double_quant = QUANTS[quantize]
            quantize_linear_4bit(m, compute_dtype=torch.bfloat16, quant_type=quant_type,
                                 double_quant=double_quant, keep_head=False, from_dtype=torch.float16)
        return m

    longest = seq_len  # model.max_seq_length: finetune/*.py sets it to the longest training sample

    def batch(batch_size: int, seq_len: int | None = None):
        """A micro-batch padded to `seq_len` tokens (default the longest sample; gpuwise's --seq-len-dist
        asks for the lengths a run reaches, plan/lengths.py)."""
        ids = torch.randint(0, 32000, (batch_size, seq_len or longest))
        return {"input_ids": ids, "labels": ids.clone()}

    kept = [None]  # the loop's `logits` (finetune/*.py: `logits = model(...)` in the training loop)

    def keep(logits):
        """`logits = model(...)`: the previous iteration's logits are released only once the model call has
        returned the new ones. gpuwise's --loop-keeps-loss says the loop keeps what it bound (step.py)."""
        from gpuwise.step import loop_keeps_last

        if loop_keeps_last():
            kept[0] = logits
        return logits

    def loss(model, batch):
        chunked_cross_entropy = importlib.import_module(f"{package}.utils").chunked_cross_entropy

        from gpuwise.plan.tracing.bnb_versions import bitsandbytes_as

        for m in model.modules():  # the prefix's k/v are an inference cache: training recomputes them every step
            if getattr(m, "adapter_kv_cache", None) is not None:
                m.adapter_kv_cache = None
        with bitsandbytes_as(bnb_version):
            if method == "full":  # finetune/full.py: the whole logits, then the chunked loss over them
                logits = keep(fabric_output(model(batch["input_ids"])))
                return chunked_cross_entropy(logits[..., :-1, :], batch["labels"][..., 1:])
            logits = keep(fabric_output(model(batch["input_ids"], lm_head_chunk_size=LM_HEAD_CHUNK)))
            logits[-1] = logits[-1][..., :-1, :]
            return chunked_cross_entropy(logits, batch["labels"][..., 1:])

    return model, batch, loss
