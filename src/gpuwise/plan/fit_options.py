"""The candidates `fit` weighs, and how each is told: a `Variant` is a set of changes to the job (precision,
checkpointing, optimizer, LoRA / QLoRA, offload, a split over N GPUs); each comes with what it changes in the
training's numerics (NOTES), the code to write (CODE), the optional packages it needs, and the `gpuwise estimate`
/ `gpuwise train` commands that reproduce one of its options."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..hf import stack_config
from ..optional_libs import sized_without_notes
from ..step import StepConfig
from .catalog import GpuSpec
from .curve import DEFAULT_MARGIN_PCT
from .memory.cuda import RETRIES_NOTE
from .memory.split import DEFAULT_NODE_SIZE, Split
from .point import Point
from .tracing.modes import TrainingModes

NOTES = {
    "fp32": "fp32 weights and math",
    "bf16": "bf16 autocast: fp32 master weights and optimizer; matmuls in bf16 (8-bit mantissa), usually loss-neutral",
    "fp16": "fp16 autocast + GradScaler: dynamic loss scaling, steps with inf/NaN gradients are skipped",
    "bf16-pure": "weights and optimizer state in bf16: updates under 2^-8 of a weight are lost "
                 "(keep fp32 master weights or use stochastic rounding for long runs)",
    "checkpointing": "same math; one extra forward of each block in backward (~1/3 more FLOPs)",
    "adamw8bit": "8-bit blockwise Adam states (Dettmers et al. 2022): matched 32-bit Adam in their benchmarks",
    "adafactor": "Adafactor: factored second moment, no momentum: a different optimizer (retune the learning rate)",
    "lora": "LoRA: only rank-r adapters train (not a full fine-tune); quality depends on rank and task",
    "qlora": "QLoRA: frozen base in NF4 (quantization error in the base; matched 16-bit LoRA in the QLoRA paper)",
    "offload": "same math; the optimizer step runs on the CPU (PCIe and host-memory bound)",
    "fused-linear": "same loss and gradients (Liger's fused linear cross-entropy: summed chunk by chunk, float "
                    "rounding order differs); the float32 logits are never made",
    "accum": "same effective batch in {k} micro-batches of {m}",
    "accum-bn": "same effective batch in {k} micro-batches of {m} (BatchNorm statistics see {m} samples)",
    "ddp": "same math as one GPU with the batch x N",
    "sharded": "same math as DDP; state sharded (communication grows, see samples/s)",
    "pipeline": "same math with micro-batches; pipeline bubble (N-1)/(m+N-1) of the time idle",
}

CODE = {
    "bf16": "with torch.autocast('cuda', dtype=torch.bfloat16): loss = ...",
    "fp16": "scaler = torch.amp.GradScaler(); with torch.autocast('cuda', dtype=torch.float16): ...; "
            "scaler.scale(loss).backward(); scaler.step(opt); scaler.update()",
    "bf16-pure": "model.to(torch.bfloat16)",
    "checkpointing": "model.gradient_checkpointing_enable()  # or torch.utils.checkpoint per block",
    "adamw8bit": "opt = bitsandbytes.optim.AdamW8bit(model.parameters(), lr=...)",
    "adafactor": "opt = transformers.optimization.Adafactor(params, lr=..., relative_step=False, scale_parameter=False)",
    "lora": "model = peft.get_peft_model(model, LoraConfig(r={r}, lora_alpha={a}, target_modules='all-linear'))",
    "qlora": "from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="
             "'nf4', bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)) + LoRA",
    "offload": "DeepSpeed zero_optimization.offload_optimizer.device='cpu' (or FSDP2 CPUOffloadPolicy)",
    "fused-linear": "liger_kernel.transformers.apply_liger_kernel_to_<model>(rope=False, rms_norm=False, swiglu=False)"
                    "  # Liger's fused linear cross-entropy only (its default); Trainer: use_liger_kernel=True",
    "accum": "loss / {k} .backward() for {k} micro-batches of {m}, then opt.step(); opt.zero_grad()",
    "ddp": "torchrun --nproc-per-node {n} ...; model = DistributedDataParallel(model)",
    "zero1": "DeepSpeed zero_optimization.stage=1",
    "zero2": "DeepSpeed zero_optimization.stage=2 (or FSDP2 fully_shard(reshard_after_forward=False))",
    "fsdp": "for block in {blocks}: fully_shard(block); fully_shard(model)  # FSDP2",
    "fsdp-grad-op": "fully_shard(block, reshard_after_forward=False) per block; fully_shard(model)",
    "hsdp": "fully_shard(..., mesh=init_device_mesh('cuda', (nodes, {s}), mesh_dim_names=('rep', 'shard')))",
    "pipeline": "torch.distributed.pipelining: split the layers into {n} stages (schedule 1F1B)",
}


@dataclass(frozen=True)
class Variant:
    """A candidate: changes to the step, before the micro-batch is chosen."""

    name: str
    config: StepConfig
    modes: TrainingModes
    split: Split
    keys: tuple[str, ...]   # NOTES / CODE entries that describe it


def mixed_precision(spec: GpuSpec) -> str:
    return "bf16" if spec.flops.get("bf16") else "fp16"


def variants(spec: GpuSpec, nproc: int, precision: str, optimizer: str | None, checkpointing: bool,
             adapters: bool = True, accum_sync: str = "last", cross_entropy: str = "model",
             heavy_logits: bool = False, train_metrics: int = 0) -> list[Variant]:
    """The candidates, as given first. `adapters`: the model has linear layers for LoRA / QLoRA.
    `accum_sync`: when the multi-GPU options reduce their gradients under accumulation (split.py ACCUM_SYNCS).
    `cross_entropy`: the causal LM's loss in every option (plan/tracing/losses.py). `heavy_logits`: a causal LM
    whose float32 logits are a large part of the card (`heavy_logits`): Liger's fused linear cross-entropy is
    weighed too, where the given loss is the model's own and no training metrics need the logits.
    `train_metrics`: Composer's training metrics over the logits in every option (losses.py)."""
    mixed = mixed_precision(spec)
    one = Split()
    opt = optimizer or "adamw"
    given = TrainingModes(cross_entropy=cross_entropy, train_metrics=train_metrics)
    out = [Variant("as given", StepConfig(optimizer, precision, checkpointing), given, one, ())]

    def add(name, prec, ckpt, opt_name, modes=TrainingModes(), split=one, keys=()):
        if modes.cross_entropy == "model":
            modes = replace(modes, cross_entropy=cross_entropy, train_metrics=train_metrics)
        v = Variant(name, StepConfig(opt_name, prec, ckpt), modes, split, tuple(keys))
        if all((v.config, v.modes, v.split) != (o.config, o.modes, o.split) for o in out):
            out.append(v)

    add(mixed, mixed, checkpointing, opt, keys=(mixed,))
    add(f"{mixed} + checkpointing", mixed, True, opt, keys=(mixed, "checkpointing"))
    add(f"{mixed} + checkpointing + 8-bit AdamW", mixed, True, "adamw8bit", keys=(mixed, "checkpointing", "adamw8bit"))
    add(f"{mixed} + checkpointing + Adafactor", mixed, True, "adafactor", keys=(mixed, "checkpointing", "adafactor"))
    add(f"{mixed} + checkpointing + optimizer offload", mixed, True, opt, TrainingModes(offload_optimizer=True),
        keys=(mixed, "checkpointing", "offload"))
    if spec.flops.get("bf16"):
        add("pure bf16 + checkpointing + 8-bit AdamW", "bf16-pure", True, "adamw8bit",
            keys=("bf16-pure", "checkpointing", "adamw8bit"))
    if adapters:
        add(f"LoRA r16 ({mixed})", mixed, False, opt, TrainingModes(lora_rank=16), keys=(mixed, "lora"))
        add(f"LoRA r16 ({mixed}) + checkpointing", mixed, True, opt, TrainingModes(lora_rank=16),
            keys=(mixed, "lora", "checkpointing"))
        add(f"QLoRA r16 ({mixed}) + checkpointing", mixed, True, opt, TrainingModes(lora_rank=16, qlora=True),
            keys=(mixed, "qlora", "checkpointing"))
    if heavy_logits and cross_entropy == "model" and not train_metrics:
        liger = TrainingModes(cross_entropy="fused-linear")
        add(f"{mixed} + checkpointing + fused linear CE", mixed, True, opt, liger,
            keys=(mixed, "checkpointing", "fused-linear"))
        if adapters:
            add(f"LoRA r16 ({mixed}) + checkpointing + fused linear CE", mixed, True, opt,
                replace(liger, lora_rank=16), keys=(mixed, "lora", "checkpointing", "fused-linear"))
    if nproc > 1:
        strategies = ["ddp", "zero1", "zero2", "fsdp", "fsdp-grad-op", "pipeline"]
        if nproc > DEFAULT_NODE_SIZE:
            strategies.append("hsdp")
        for s in strategies:
            split = Split(s, nproc, accum_sync=accum_sync if s != "pipeline" else "last")
            for ckpt in (False, True):
                label = f"{s} x{nproc} ({mixed}{' + checkpointing' if ckpt else ''})"
                add(label, mixed, ckpt, opt, split=split, keys=(mixed, s) + (("checkpointing",) if ckpt else ()))
        if adapters:
            add(f"ddp x{nproc} + LoRA r16 ({mixed})", mixed, False, opt, TrainingModes(lora_rank=16),
                Split("ddp", nproc, accum_sync=accum_sync), keys=(mixed, "lora", "ddp"))
    return out


HEAVY_LOGITS = 0.01  # one sample's float32 logits at least this fraction of the card: weigh the fused loss


def heavy_logits(wl: Any, memory_bytes: int) -> bool:
    """A model config's causal LM whose float32 logits for one sample (seq_len x vocab x 4 bytes; the model's own
    loss holds several such copies per sample at its peak) are at least HEAVY_LOGITS of `memory_bytes`: Llama 3's
    128k vocabulary at 2048 tokens is 1 GiB, 4 % of a 24 GB card; Llama 2's 32k at 512 tokens 0.3 %."""
    cfg = getattr(wl, "hf_config", None)
    if cfg is None or getattr(wl, "task", None) != "causal-lm" or not getattr(wl, "seq_len", None):
        return False
    vocab = int(getattr(stack_config(cfg), "vocab_size", 0) or 0)
    return wl.seq_len * vocab * 4 >= HEAVY_LOGITS * memory_bytes


MODEL_BLOCKS = "model.model.layers"  # a causal LM's blocks, where the model's own are not known


def blocks_code(paths: tuple[str, ...] | None) -> str:
    """The blocks FSDP shards one by one as code names them (plan/memory/fsdp_units.py `block_lists`: the model's
    ModuleLists of blocks, e.g. ("model.layers",), or an encoder-decoder's two)."""
    if not paths:
        return MODEL_BLOCKS
    names = [f"model.{path}" for path in paths]
    return names[0] if len(names) == 1 else "[" + ", ".join(f"*{name}" for name in names) + "]"


def changes_of(v: Variant, micro: int, accum: int, nproc: int, blocks: str = MODEL_BLOCKS) -> dict[str, Any]:
    c: dict[str, Any] = {"precision": v.config.precision, "checkpointing": v.config.checkpointing,
                         "optimizer": v.config.optimizer or "workload/adamw", "micro_batch_size": micro,
                         "grad_accum": accum, "nproc": v.split.nproc, "strategy": v.split.strategy}
    if v.modes.lora_rank:
        c["lora_rank"] = v.modes.lora_rank
    if v.modes.qlora:
        c["qlora"] = True
    if v.modes.offload_optimizer:
        c["offload_optimizer"] = True
    if v.modes.cross_entropy != "model":
        c["cross_entropy"] = v.modes.cross_entropy
    if v.modes.train_metrics:
        c["train_metrics"] = v.modes.train_metrics
    keys = [k for k in v.keys if k in CODE]
    if accum > 1:
        keys.append("accum")
    r = v.modes.lora_rank or 16
    c["code"] = [CODE[k].format(k=accum, m=micro, n=v.split.nproc, r=r, a=2 * r, s=v.split.shards, blocks=blocks)
                 for k in keys]
    return c


def notes_of(v: Variant, micro: int, accum: int, point: Point) -> list[str]:
    notes = [NOTES[k] for k in v.keys if k in NOTES and k != "accum"]
    notes += sized_without_notes(v.config.optimizer, v.modes.adapters)
    if v.split.strategy in ("zero1", "zero2", "fsdp", "fsdp-grad-op", "hsdp"):
        notes.append(NOTES["sharded"])
    if accum > 1:
        notes.append(NOTES["accum-bn" if point.batch_norm else "accum"].format(k=accum, m=micro))
    notes += [n for n in point.notes
              if n.startswith(("numbers from", "pipeline", "DDP", "fsdp", "zero", "hsdp", RETRIES_NOTE))]
    return list(dict.fromkeys(notes))


def step_flags(v: Variant, micro: int, accum: int) -> list[str]:
    """The flags of one option's step, as `estimate` and `train` both take them: micro-batch, precision,
    optimizer, checkpointing, LoRA / QLoRA, optimizer offload (train_args declines those), accumulation."""
    args = ["-b", str(micro), "--precision", v.config.precision]
    if v.config.optimizer:
        args += ["--optimizer", v.config.optimizer]
    if v.config.checkpointing:
        args.append("--checkpointing")
    if v.modes.qlora:
        args.append("--qlora")
    elif v.modes.lora_rank:
        args += ["--lora", str(v.modes.lora_rank)]
    if v.modes.offload_optimizer:
        args.append("--offload-optimizer")
    if v.modes.cross_entropy != "model":
        args += ["--cross-entropy", v.modes.cross_entropy]
    if v.modes.train_metrics:
        args += ["--train-metrics", str(v.modes.train_metrics)]
    if accum > 1:
        args += ["--grad-accum", str(accum)]
    return args


def estimate_args(source: str, gpu: str, v: Variant, micro: int, accum: int, margin_pct: float) -> list[str] | None:
    """The `gpuwise estimate` arguments of one option (None for pipeline: estimate does not split layers)."""
    if v.split.strategy == "pipeline":
        return None
    args = ["gpuwise", "estimate", source, *step_flags(v, micro, accum)]
    if v.split.nproc > 1:
        args += ["-n", str(v.split.nproc), "--strategy", v.split.strategy]
        if v.split.accum_sync != "last":
            args += ["--accum-sync", v.split.accum_sync]
    args += ["--gpu", gpu]
    if margin_pct != DEFAULT_MARGIN_PCT:
        args += ["--margin", f"{margin_pct:g}"]
    return args + ["--no-max-batch"]


TRAINABLE_STRATEGIES = ("single", "ddp", "fsdp", "fsdp-grad-op", "hsdp")  # scaleout/fsdp.py runs these


def train_args(source: list[str], v: Variant, micro: int, accum: int) -> list[str] | None:
    """The `gpuwise train` arguments that run one option (None where train does not: ZeRO-1/2 without FSDP,
    pipeline, optimizer offload, accumulation reducing every micro-batch: train syncs on the last one only;
    a chunked or fused cross-entropy, training metrics: train runs the model's own loss, and no metrics).
    `source` as `source_args` gives it (estimate's --task is not train's)."""
    if (v.split.strategy not in TRAINABLE_STRATEGIES or v.modes.offload_optimizer or v.modes.cross_entropy != "model"
            or v.modes.train_metrics):
        return None
    if accum > 1 and v.split.sync_every_micro_step:
        return None
    named = list(source)
    if "--task" in named:
        i = named.index("--task")
        del named[i:i + 2]
    args = ["gpuwise", "train", *named, *step_flags(v, micro, accum)]
    nproc = max(v.split.nproc, 1)
    args += ["-n", str(nproc)]
    if v.split.strategy not in ("single", "ddp"):
        args += ["--strategy", v.split.strategy]
    return args


def source_args(workload: Any, wl: Any) -> list[str] | None:
    """The workload as estimate's command line names it: a model config with its sequence length and
    head; a workload file or examples:NAME as given; None for a model object."""
    if getattr(wl, "hf_config", None) is not None:
        tokens = ["--seq-len", str(wl.seq_len)] if getattr(wl, "seq_len", None) else []  # not an image classifier's
        targets = ["--target-len", str(wl.target_len)] if getattr(wl, "target_len", None) else []
        return [str(wl.source), *tokens, "--task", str(wl.task), *targets]
    return [workload] if isinstance(workload, str) else None


def needed(v: Variant) -> list[str]:
    """The optional packages running `v` takes."""
    out = ["bitsandbytes"] if v.config.optimizer == "adamw8bit" or v.modes.qlora else []
    out += ["liger_kernel"] if v.modes.cross_entropy == "fused-linear" else []  # traced without it (losses.py)
    return out + (["peft"] if v.modes.adapters else [])


def untraceable_without(v: Variant) -> list[str]:
    """The packages a trace of `v` cannot stand in for: QLoRA's (peft over bitsandbytes' 4-bit layers).
    8-bit AdamW's state and LoRA's adapters on nn.Linear are sized without them (optional_libs.py)."""
    return ["peft", "bitsandbytes"] if v.modes.qlora else []
