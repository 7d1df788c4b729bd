"""A causal LM's cross-entropy as the libraries that save its memory compute it (`--cross-entropy`).

A Hugging Face causal LM computes its own loss: the head's logits for every token (batch x seq x vocab), upcast
to float32 by `ForCausalLMLoss`, then `cross_entropy`. At a 128k vocabulary those are the step's largest
tensors. Three ways people avoid them, each traced here as its code runs it, on the model's own body and head:

- "fused": flash-attn's `CrossEntropyLoss` (flash_attn/losses/cross_entropy.py, `inplace_backward=False`), which
  llm-foundry trains with by default (`loss_fn: fused_crossentropy`, `ComposerMPTCausalLM`): the model's logits
  in the compute dtype, no float32 copy; the kernel makes a float32 loss and log-sum-exp per token and keeps the
  logits for its backward, which makes their gradient (`empty_like(logits)`). Its two kernels are
  `gpuwise::xentropy_fwd` / `gpuwise::xentropy_bwd` here: outputs only, computed on real tensors.
- "chunked": torchtune's `CEWithChunkedOutputLoss` (torchtune/modules/loss/ce_chunked_output_loss.py, 8 chunks,
  with `TransformerDecoder.chunked_output`): the head runs on 8 chunks of the sequence (its logits, in the
  compute dtype, all kept), and each chunk is upcast and cross-entropied alone, `reduction="sum"`, over the
  number of labelled tokens: the float32 copy is one chunk's at a time (the float32 log-softmax each chunk's
  cross-entropy keeps for the backward is every chunk's).
- "fused-linear": Liger-Kernel's `LigerFusedLinearCrossEntropyFunction` (linkedin/Liger-Kernel
  src/liger_kernel/ops/fused_linear_cross_entropy.py, commit 00eba634; what `TrainingArguments(use_liger_kernel=True)`
  patches into a transformers model): the hidden states are cut into chunks of
  `next_power_of_2(ceil(BT / ceil(V / H)))` tokens, about BT x H logits at a time; each chunk's logits are made,
  turned into their gradient in place by one kernel, and multiplied into the input's and the head's gradients
  in the forward; the backward only returns them. Its buffers are Liger's: `grad_input` (zeros like the input),
  `grad_weight` (zeros like the head's weight), a float32 loss per token, the token mask, and on CUDA with
  16-bit operands and no autograd recording the chunk's logits buffer (`torch.mm(out=)`), the head's gradient
  accumulated by `addmm(out_dtype=float32, out=)` on sm80+ or `mm(...).float()` added on older GPUs.

The cross-entropy kernel itself (Liger's Triton `liger_cross_entropy_kernel`) is `gpuwise::cross_entropy_grad_`
here: it writes each row's loss and overwrites the row's logits with their gradient, allocating nothing; on
fake tensors it does nothing, on real ones it computes them (float32 softmax per row), so the loss and the
gradients can be checked against the model's own.

Training metrics (`--train-metrics N`): Composer's trainer (v0.10 on, `Trainer._train_microbatch`) updates the
model's training metrics after every micro-batch's backward (`_eval_train_metrics`: `torch.no_grad()`, the
precision's autocast, `eval_forward(batch, state.outputs)`, which returns the step's own outputs), so the loop
holds the logits (`state.outputs`) through the backward. llm-foundry's causal LMs train with
`LanguageCrossEntropy` and `LanguagePerplexity` (both `torch.nn.CrossEntropyLoss(ignore_index=-100,
reduction='sum')` over the flattened logits, composer/metrics/nlp.py; `TokenAccuracy` joined them in later
releases): N = 2. Each runs here, after the backward (an autograd final callback, queued when the backward
reaches the loss), under the autocast of the logits' 16-bit dtype (amp_bf16 / amp_fp16; the installed torch's
CUDA policy, plan/tracing/cuda_autocast.py, decomposes cross_entropy: the log-softmax in the logits' dtype, cast
to float32 for nll_loss). Composer keeps the outputs until the next micro-batch's forward returns; here they
are released after the metrics.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

from ...errors import GpuwiseError
from ...hf import stack_config
from .cuda_autocast import cuda_autocast_policy, cuda_policy_active
from .setup import is_fake

CROSS_ENTROPY = ("model", "fused", "chunked", "fused-linear")
CROSS_ENTROPY_NAMES = {"fused": "fused cross-entropy (flash-attn's CrossEntropyLoss; llm-foundry's default)",
                       "chunked": "cross-entropy in 8 chunks (torchtune's CEWithChunkedOutputLoss)",
                       "fused-linear": "fused linear cross-entropy (Liger-Kernel; transformers' use_liger_kernel)"}
TORCHTUNE_CHUNKS = 8  # torchtune's CEWithChunkedOutputLoss(num_output_chunks=8)
IGNORE_INDEX = -100


@functools.cache
def _kernel():
    """The in-place cross-entropy kernel (registered once, on first use)."""
    import torch

    @torch.library.custom_op("gpuwise::cross_entropy_grad_", mutates_args=("logits", "loss"),
                             schema="(Tensor(a!) logits, Tensor target, Tensor(b!) loss, Tensor n_valid, "
                                    "float softcap) -> ()")
    def cross_entropy_grad_(logits, target, loss, n_valid, softcap):
        x = logits.float()
        if softcap > 0:
            x = softcap * torch.tanh(x / softcap)
        valid = target != IGNORE_INDEX
        safe = target.clamp(min=0)
        lse = torch.logsumexp(x, dim=-1)
        n = n_valid.float().clamp(min=1)
        loss.copy_(torch.where(valid, lse - x.gather(1, safe[:, None]).squeeze(1), 0.0) / n)
        grad = torch.softmax(x, dim=-1)
        grad[torch.arange(len(safe)), safe] -= 1
        if softcap > 0:  # d softcap*tanh(z/softcap) / dz
            grad = grad * (1 - (x / softcap) ** 2)
        logits.copy_(torch.where(valid[:, None], grad / n, 0.0))

    @cross_entropy_grad_.register_fake
    def _(logits, target, loss, n_valid, softcap):
        return None

    return cross_entropy_grad_


@functools.cache
def _xentropy():
    """flash-attn's cross-entropy kernels (forward: loss and log-sum-exp per row, float32; backward: the logits'
    gradient, in their dtype), registered once."""
    import torch

    @torch.library.custom_op("gpuwise::xentropy_fwd", mutates_args=(),
                             schema="(Tensor logits, Tensor labels) -> (Tensor, Tensor)")
    def xentropy_fwd(logits, labels):
        x = logits.float()
        lse = torch.logsumexp(x, dim=-1)
        picked = x.gather(1, labels.clamp(min=0)[:, None]).squeeze(1)
        return torch.where(labels != IGNORE_INDEX, lse - picked, 0.0), lse

    @xentropy_fwd.register_fake
    def _(logits, labels):
        rows = logits.new_empty(logits.shape[0], dtype=torch.float32)
        return rows, torch.empty_like(rows)

    @torch.library.custom_op("gpuwise::xentropy_bwd", mutates_args=(),
                             schema="(Tensor dlosses, Tensor logits, Tensor lse, Tensor labels) -> Tensor")
    def xentropy_bwd(dlosses, logits, lse, labels):
        grad = torch.exp(logits.float() - lse[:, None])
        grad[torch.arange(len(labels)), labels.clamp(min=0)] -= 1
        grad = grad * torch.where(labels != IGNORE_INDEX, dlosses, 0.0)[:, None]
        return grad.to(logits.dtype)

    @xentropy_bwd.register_fake
    def _(dlosses, logits, lse, labels):
        return torch.empty_like(logits)

    class CrossEntropyLoss(torch.autograd.Function):
        """flash-attn's CrossEntropyLossFunction: saves the logits, log-sum-exp and labels."""

        @staticmethod
        def forward(ctx, logits, labels):
            losses, lse = xentropy_fwd(logits, labels)
            ctx.save_for_backward(logits, lse, labels)
            return losses

        @staticmethod
        def backward(ctx, dlosses):
            logits, lse, labels = ctx.saved_tensors
            return xentropy_bwd(dlosses.contiguous(), logits, lse, labels), None

    return CrossEntropyLoss


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _fused_linear_forward(x, weight, target, softcap: float, capability: tuple[int, int]):
    """Liger's `fused_linear_cross_entropy_forward` (reduction mean, no bias, no class weights): the loss and
    the input's and weight's gradients, made chunk by chunk."""
    import torch

    bt, h = x.shape
    v = weight.shape[0]
    inc_factor = -(-v // h)
    chunk = min(_next_power_of_2(-(-bt // inc_factor)), bt)
    chunks = -(-bt // chunk)
    grad_input = torch.zeros_like(x)
    grad_weight = torch.zeros_like(weight) if weight.requires_grad else None
    loss_1d = torch.zeros(bt, dtype=torch.float32, device=x.device)
    n_valid = (target != IGNORE_INDEX).sum()  # Liger reads it with .item(); the kernel takes it as a number
    autocast = torch.is_autocast_enabled(x.device.type)
    low = torch.get_autocast_dtype(x.device.type) if autocast else None
    # `_can_use_mm_out`: a CUDA matmul that would return its operands' own 16-bit dtype writes into one buffer
    mm_out = (x.dtype == weight.dtype and x.dtype in (torch.float16, torch.bfloat16, torch.float32)
              and (not autocast or x.dtype == low))
    storage = torch.empty((chunk, v), dtype=x.dtype, device=x.device) if mm_out else None
    kernel = _kernel()
    for i in range(chunks):
        start, end = i * chunk, min((i + 1) * chunk, bt)
        x_chunk = x[start:end]
        if storage is not None:
            logits = storage[: end - start]
            torch.mm(x_chunk, weight.t(), out=logits)
        else:
            logits = x_chunk @ weight.t()
        logits = logits.contiguous()
        kernel(logits, target[start:end].contiguous(), loss_1d[start:end], n_valid, float(softcap or 0.0))
        if mm_out and logits.dtype == grad_input.dtype:
            torch.mm(logits, weight, out=grad_input[start:end])
        else:
            grad_input[start:end] = logits @ weight
        if grad_weight is not None:
            half = logits.dtype in (torch.float16, torch.bfloat16)
            if capability >= (8, 0) and half and grad_weight.dtype in (torch.float32, logits.dtype):
                x_half = x_chunk if x_chunk.dtype == logits.dtype else x_chunk.to(logits.dtype)
                if is_fake(grad_weight):  # addmm(out_dtype=) has CUDA and meta kernels only
                    kw = {"out_dtype": torch.float32} if grad_weight.dtype == torch.float32 else {}
                    torch.addmm(grad_weight, logits.t(), x_half, out=grad_weight, **kw)
                else:  # the same sum on real CPU tensors (values checked in the tests)
                    grad_weight.add_(torch.mm(logits.t().float(), x_half.float()).to(grad_weight.dtype))
                del x_half
            else:
                grad_weight += torch.mm(logits.t(), x_chunk).float()
        del logits, x_chunk
    del storage
    loss = torch.sum(loss_1d)
    if grad_weight is not None:
        grad_weight = grad_weight.to(weight.dtype)
    return loss, grad_input, grad_weight


@functools.cache
def _fused_linear_function():
    import torch

    class FusedLinearCrossEntropy(torch.autograd.Function):
        """Liger's `LigerFusedLinearCrossEntropyFunction`: the gradients are made in the forward and saved."""

        @staticmethod
        def forward(ctx, x, weight, target, softcap, capability):
            loss, grad_input, grad_weight = _fused_linear_forward(x, weight, target, softcap, capability)
            ctx.save_for_backward(grad_input.detach(), grad_weight.detach() if grad_weight is not None else None)
            return loss

        @staticmethod
        def backward(ctx, grad_output):
            grad_input, grad_weight = ctx.saved_tensors
            # Liger skips its element_mul kernel when grad_output is 1.0 (the loss is the last op), as here
            return grad_input, grad_weight, None, None, None

    return FusedLinearCrossEntropy


def _body_and_head(model, source: str) -> tuple[Any, Any]:
    """The transformer body (hidden states) and output head of a transformers causal LM, peft-wrapped or not."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    body = getattr(inner, "base_model", None)
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    if body is None or body is inner or weight is None or getattr(weight, "dim", lambda: 0)() != 2:
        raise GpuwiseError(f"{source}: --cross-entropy needs a transformers causal LM with a body and a linear "
                           f"output head; {type(inner).__name__} has not")
    if getattr(head, "bias", None) is not None:
        raise GpuwiseError(f"{source}: --cross-entropy: the output head has a bias, which these losses are not "
                           "traced with; cannot tell")
    return body, head


def check_cross_entropy(kind: str, wl) -> None:
    """Refuse a `kind` (one of CROSS_ENTROPY, as TrainingModes checked) the workload's loss cannot be computed
    with (one line, before any trace)."""
    if kind == "model":
        return
    _refuse_unless_causal_lm(f"--cross-entropy {kind}", wl)
    text = stack_config(wl.hf_config)
    # "fused" takes the model's own logits (scaled as it scales them); the others make them from the head
    for key in ("output_router_logits",) + (("logit_scale",) if kind != "fused" else ()):
        value = getattr(text, key, None)
        if value not in (None, False, 1, 1.0):
            raise GpuwiseError(f"--cross-entropy {kind}: {wl.hf_config.model_type}'s head has {key}={value!r}, which "
                               f"{CROSS_ENTROPY_NAMES[kind]} does not compute; cannot tell")


def _refuse_unless_causal_lm(flag: str, wl) -> None:
    """`flag` applies to a model config's or Hub model's causal LM only (one line, before any trace)."""
    if getattr(wl, "hf_config", None) is None:
        raise GpuwiseError(f"{flag}: for a model config's or Hub model's causal LM; {wl.spec} computes its own loss")
    if getattr(wl, "task", None) != "causal-lm":
        raise GpuwiseError(f"{flag}: for a causal LM (--task causal-lm); {wl.spec} is trained as {wl.task}")


def check_train_metrics(n: int, kind: str, wl) -> None:
    """Refuse training metrics (`n` > 0) where there are no full logits to compute them over (one line)."""
    if n == 0:
        return
    if kind not in ("model", "fused"):
        raise GpuwiseError(f"--train-metrics: computed over the model's full logits, which {CROSS_ENTROPY_NAMES[kind]} "
                           "never makes; use --cross-entropy model or fused")
    _refuse_unless_causal_lm("--train-metrics", wl)


def _metrics_after_backward(loss, logits, target, n: int) -> None:
    """Composer's `_eval_train_metrics` (module doc): `n` sum-reduced cross-entropies over the logits once the
    backward of `loss` has finished, outside every module; the logits are held until then."""
    import torch
    from torch.autograd import Variable

    from .dispatch import active_trace_mode

    held = [logits.detach().reshape(-1, logits.shape[-1])]
    flat_target = target.reshape(-1)

    def metrics():
        flat = held.pop()
        low = flat.dtype if flat.dtype in (torch.bfloat16, torch.float16) else None
        tracer = active_trace_mode()
        with contextlib.ExitStack() as stack:
            if tracer is not None:
                stack.enter_context(tracer.tracker.outside())
                if tracer.target == "cuda" and low is not None and not cuda_policy_active():
                    stack.enter_context(cuda_autocast_policy())  # a step without autocast (16-bit weights)
            stack.enter_context(torch.no_grad())
            stack.enter_context(torch.autocast(flat.device.type, dtype=low, enabled=low is not None))
            for _ in range(n):
                torch.nn.functional.cross_entropy(flat, flat_target, ignore_index=IGNORE_INDEX, reduction="sum")
        del flat

    def queue(grad):
        if held:
            Variable._execution_engine.queue_callback(metrics)
        return grad

    loss.register_hook(queue)


def causal_lm_loss(kind: str, source: str, cfg, train_metrics: int = 0) -> Any:
    """`compute_loss(model, batch)` for a transformers causal LM computing its cross-entropy as `kind` does,
    with `train_metrics` metrics over its logits after each backward (module doc)."""
    text = stack_config(cfg)
    softcap = float(getattr(text, "final_logit_softcapping", None) or 0.0)

    def loss(model, batch):
        import torch

        from .sdpa import current_target

        ids, labels = batch["input_ids"], batch["labels"]
        # the next token's label at each position, the last one ignored (Liger's LigerForCausalLMLoss, torchtune's
        # recipes, Composer's shift_labels): no shifted copy of the hidden states or logits
        target = torch.nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
        if kind == "model":  # the model's own loss, and its logits for the metrics
            out = model(**batch)
            result = out.loss
        if kind == "fused":  # the model's own logits (no labels: no loss of its own), flash-attn's loss on them
            out = model(input_ids=ids)
            losses = _xentropy().apply(out.logits.reshape(-1, out.logits.shape[-1]), target.reshape(-1))
            result = losses.sum() / (target != IGNORE_INDEX).sum()
        if kind in ("model", "fused"):
            if train_metrics:
                _metrics_after_backward(result, out.logits, target, train_metrics)
            return result
        body, head = _body_and_head(model, source)
        hidden = body(input_ids=ids).last_hidden_state
        if kind == "fused-linear":
            cap = current_target().capability or (9, 0)
            return _fused_linear_function().apply(hidden.reshape(-1, hidden.shape[-1]), head.weight,
                                                  target.reshape(-1), softcap, tuple(cap))
        logits = [head(chunk) for chunk in hidden.chunk(TORCHTUNE_CHUNKS, dim=1)]
        if softcap:
            logits = [softcap * torch.tanh(chunk / softcap) for chunk in logits]
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for chunk, labels_chunk in zip(logits, target.chunk(TORCHTUNE_CHUNKS, dim=1)):
            total = total + torch.nn.functional.cross_entropy(chunk.reshape(-1, chunk.shape[-1]).float(),
                                                              labels_chunk.reshape(-1), ignore_index=IGNORE_INDEX,
                                                              reduction="sum")
        return total / (target != IGNORE_INDEX).sum()

    return loss
