"""Arguments shared by the commands that run a workload, and their conversion to library types."""

from __future__ import annotations

import argparse

from ..errors import GpuwiseError
from ..hf import TASKS
from ..plan.memory.split import ACCUM_SYNCS
from ..plan.tracing.losses import CROSS_ENTROPY
from ..step import OPTIMIZERS, PRECISIONS, StepConfig, checkpointing_mode
from ..workload import Workload, load_workload

BATCH_MEANING = "samples per forward/backward on each GPU"


def add_workload_arguments(p: argparse.ArgumentParser, batch_required: bool = False, batch_default: int | None = None,
                           configs: bool = False, batch_help: str = BATCH_MEANING) -> None:
    """The options every command that runs or plans a workload shares, with one meaning: the workload, the
    batch, the optimizer, the precision and checkpointing (`configs`: also hf:ID / config.json, with
    --seq-len and --task). `-b` is BATCH_MEANING everywhere; fit alone takes the samples per optimizer
    step on each GPU, which it splits into a micro-batch (BATCH_MEANING) x gradient accumulation, and says
    so in `batch_help`. Default policy: a workload file's batch is its author's, so -b is asked for where
    the answer depends on it (estimate, measure, train); a model config's default is 1 sequence (estimate);
    a search's start (fit 8, tune 32) has a default, shown in the help."""
    p.add_argument("workload", metavar="WORKLOAD", help="path/to/job.py, pkg.module or examples:NAME"
                   + (", hf:ORG/NAME or config.json" if configs else ""))
    p.add_argument("-b", "--batch-size", type=positive_int, required=batch_required, default=batch_default,
                   help=batch_help + (f" (default {batch_default})" if batch_default else ""))
    p.add_argument("--optimizer", choices=list(OPTIMIZERS), help="override the workload's optimizer (default adamw)")
    p.add_argument("--precision", default="fp32", choices=list(PRECISIONS), help="numeric precision (default fp32)")
    p.add_argument("--checkpointing", nargs="?", const="full", default="none", choices=["none", "full", "selective"],
                   help="activation checkpointing of the repeated blocks: full (the default when given alone) "
                   "recomputes each block; selective keeps attention and every other matmul output (torchtitan's "
                   "per-op selective AC)")
    if configs:
        p.add_argument("--seq-len", type=positive_int, help="hf:ID / config.json: tokens per sample (default 512; "
                       "not for an image classifier)")
        p.add_argument("--task", choices=list(TASKS), help="hf:ID / config.json: the head (default seq2seq-lm for an "
                       "encoder-decoder such as T5 or BART, image-cls for an image model such as ViT or ConvNeXt, "
                       "else causal-lm)")
        p.add_argument("--target-len", type=positive_int, help="hf:ID / config.json, seq2seq-lm: tokens per target "
                       "(default: --seq-len)")


GPU_NAMES = "a catalog name (H100, A100-40GB, rtx4090, 'NVIDIA H200')"


def add_gpu_argument(p: argparse.ArgumentParser, *, on_this_machine: bool = False, every: bool = False,
                     required: bool = False, default: str | None = None) -> None:
    """`--gpu`, one option wherever a GPU is named. A plan names a catalog GPU, `auto` (the visible GPU with
    the most free memory) or, where a list of answers makes sense (`every`: fit), `all` (every catalog GPU);
    a command that runs the step (`on_this_machine`: measure, tune) names this machine's device: cuda,
    cuda:N, cpu or `auto` (cuda when there is one, else cpu), and keeps `--device` as the same option.
    `all` means nothing where one GPU answers (estimate, measure, tune): it is a one-line error there."""
    if on_this_machine:
        p.add_argument("--gpu", "--device", dest="device", default=default, metavar="DEVICE",
                       help="the GPU to run on: cuda, cuda:N, cpu or auto (default: cuda when there is one, else "
                            "cpu); --device is the same option")
        return
    names = GPU_NAMES + ", auto: the visible GPU with the most free memory"
    p.add_argument("--gpu", required=required, default=default, metavar="NAME",
                   help=names + (", or all: every catalog GPU" if every else "")
                   + (f" (default {default})" if default else ""))


def refuse_gpu_all(gpu: str | None, command: str, one: str = "a catalog name or auto") -> None:
    """`--gpu all` where one GPU answers: a one-line error that says where `all` applies."""
    if gpu is not None and gpu.strip().lower() == "all":
        raise GpuwiseError(f"--gpu all: `gpuwise {command}` answers for one GPU ({one}); "
                           "`gpuwise fit --gpu all` ranks every catalog GPU")


def workload_from_args(args: argparse.Namespace) -> Workload:
    return load_workload(args.workload)


def step_config_from_args(args: argparse.Namespace) -> StepConfig:
    return StepConfig(optimizer=args.optimizer, precision=args.precision,
                      checkpointing=checkpointing_mode(args.checkpointing))


def add_gpu_selection_arguments(p: argparse.ArgumentParser, per_gpu: bool = False) -> None:
    """--min-free, --max-util and --wait, as `gpuwise.pick` takes them (pick, run, launch, scale)."""
    each = " per GPU" if per_gpu else ""
    p.add_argument("--min-free", default="0", help=f"minimum free memory{each}, e.g. 10GiB, 500MiB")
    p.add_argument("--max-util", type=float, default=None, help=f"maximum utilisation{each} in percent")
    p.add_argument("--wait", default=None, help="wait up to this long for GPUs to qualify, e.g. 30s, 10m")


def add_command_argument(p: argparse.ArgumentParser, metavar: str = "-- CMD ARGS",
                         help: str = "the command to run") -> None:
    """The trailing `-- cmd args...` of run, watch and launch."""
    p.add_argument("cmd", nargs="...", metavar=metavar, help=help)


def command_from_args(args: argparse.Namespace, example: str | None = None) -> list[str]:
    """The command after `--`; with `example`, an empty command is a one-line error showing it."""
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd and example:
        raise GpuwiseError(f"no command given: use `{example}`")
    return cmd


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


ACCUM_SYNC_HELP = (
    "with --grad-accum over -n 2 or more: when the gradients are reduced. last (default): once, on the last "
    "micro-batch (torch DDP/FSDP1 no_sync(), FSDP2 set_requires_gradient_sync(False), Lightning Fabric / litgpt, "
    "HF accelerate and the HF Trainer: GradientAccumulationPlugin sync_each_batch=False); under FSDP the "
    "gradients accumulate unsharded. every: on every micro-batch, only sharded gradients kept (under FSDP: "
    "Composer / llm-foundry and the Lightning Trainer, which enter no_sync for a DDP model only; accelerate's "
    "sync_each_batch=True)")


def add_accum_sync_argument(p) -> None:
    """--accum-sync (estimate and fit)."""
    p.add_argument("--accum-sync", choices=list(ACCUM_SYNCS), default=None, help=ACCUM_SYNC_HELP)


def add_compile_argument(p) -> None:
    """--compile (estimate and fit): the speed of a model run under torch.compile, plan/speed/fusion.py."""
    p.add_argument("--compile", action="store_true",
                   help="the model runs under torch.compile: its forward's and backward's pointwise ops and "
                   "reductions priced as fused kernels (speed only; the memory estimate stays eager's)")


def add_train_metrics_argument(p) -> None:
    """--train-metrics (estimate and fit): Composer's training metrics, plan/tracing/losses.py."""
    p.add_argument("--train-metrics", type=int, default=0, metavar="N", help="a causal LM trained by Composer "
                   "(llm-foundry: 2, LanguageCrossEntropy and LanguagePerplexity): N cross-entropy metrics over the "
                   "logits after every micro-batch's backward, which holds the logits through it (default 0)")


def add_cross_entropy_argument(p) -> None:
    """--cross-entropy (estimate and fit): a causal LM's loss, plan/tracing/losses.py."""
    p.add_argument("--cross-entropy", choices=list(CROSS_ENTROPY), default=None,
                   help="a model config's causal LM loss: model (default: the model's own, float32 logits for every "
                   "token), fused (flash-attn's CrossEntropyLoss, llm-foundry's default: 16-bit logits, no float32 "
                   "copy), chunked (torchtune's CEWithChunkedOutputLoss, 8 chunks), fused-linear (Liger-Kernel's "
                   "fused linear cross-entropy, transformers' use_liger_kernel: no full logits)")
