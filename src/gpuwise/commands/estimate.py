"""`gpuwise estimate`: predict a training step's memory, FLOPs and largest batch without a GPU."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import GpuwiseError
from ..hf import is_config_source
from ..plan import estimate
from ..plan.curve import DEFAULT_MARGIN_PCT
from ..plan.inference import estimate_inference
from ..plan.memory.split import STRATEGIES
from ..report import console
from ..report.plan import plot_estimate, render_estimate
from ..report.progress import StageProgress
from ..units import fmt_bytes
from .common import (
    add_accum_sync_argument,
    add_compile_argument,
    add_cross_entropy_argument,
    add_gpu_argument,
    add_train_metrics_argument,
    add_workload_arguments,
    positive_int,
    refuse_gpu_all,
)

QUICK_EXIT = True  # nothing is left running or open when run() returns (cli.run exits at once)
HELP = "predict a training step's GPU memory, FLOPs and largest batch (no GPU needed)"
EXAMPLES = """\
  gpuwise estimate examples:gpt-mini --batch-size 16
  gpuwise estimate examples:gpt-mini -b 16 --gpu H100 --precision bf16 --plot memory.png
  gpuwise estimate path/to/job.py -b 32 --optimizer sgd --target cpu --json
  gpuwise estimate examples:resnet -b 64 --gpu "NVIDIA A100-SXM4-40GB" --margin 10
  gpuwise estimate examples:resnet -b 64 --gpu auto          # fits on the freest GPU here, now?
  gpuwise estimate hf:Qwen/Qwen2.5-7B --seq-len 2048 --precision bf16 --gpu H100   # config.json only; -b 1
  gpuwise estimate path/to/config.json -b 4 --qlora --precision bf16 --gpu rtx4090 --grad-accum 8
  gpuwise estimate path/to/config.json -b 2 -n 8 --strategy fsdp --precision bf16 --gpu H100  # one rank of 8
--target cuda (default) replays the step through a model of PyTorch's CUDA caching allocator and adds
the cuBLAS workspaces and CUDA context: peak allocated, reserved and what nvidia-smi would show.
--target cpu predicts the CPU peak. --gpu NAME adds fits / largest batch and a roofline bound.
"""


def add_arguments(p) -> None:
    add_workload_arguments(p, configs=True)  # -b: required for workload files, 1 sequence by default for a config
    p.add_argument("--target", choices=["cuda", "cpu"], default="cuda", help="device to predict for (default cuda)")
    add_gpu_argument(p)
    p.add_argument("--margin", type=float, default=None, metavar="PCT",
                   help="percent of GPU memory kept free when finding the largest batch (default 5)")
    p.add_argument("--no-max-batch", action="store_true", help="with --gpu: skip the largest-batch search")
    p.add_argument("--plot", metavar="FILE", help="write a chart (memory breakdown, memory vs batch size) to FILE")
    p.add_argument("--layer-checkpointing", type=positive_int, metavar="N",
                   help="torchtitan's layer-level selective checkpointing (every N-th block): its recomputation in "
                        "the predicted speed only; memory as without it")
    add_mode_arguments(p)
    add_version_arguments(p)
    add_split_arguments(p)
    add_length_arguments(p)


def add_length_arguments(p) -> None:
    """A dataset of varying sample lengths over a run (plan/lengths.py)."""
    p.add_argument("--seq-len-dist", metavar="FILE", help="the dataset's sample lengths in tokens: a text file, "
                   "one LENGTH (a sample) or LENGTH COUNT (a histogram bin) a line (docs/contracts.md); with "
                   "--micro-steps the peak is the run's: the first micro-step at the longest sample, the later ones "
                   "at the longest padded length they are expected to reach. Without it every step is at the "
                   "workload's length (for a varying dataset traced at its longest: an upper bound)")
    p.add_argument("--micro-steps", type=positive_int, metavar="N", help="--seq-len-dist: the run's forward + "
                   "backward iterations per rank (optimizer steps x --grad-accum; litgpt's iterations)")
    p.add_argument("--first-batch", choices=["longest", "random"], default="longest", help="--seq-len-dist: the "
                   "run's first micro-batch: longest (default; litgpt forces its longest sample into iteration 0, "
                   "transformers' group_by_length its longest batch) or random (a plain shuffled loader)")
    p.add_argument("--sampling", choices=["replacement", "epoch"], default="replacement", help="--seq-len-dist: "
                   "how a rank draws its samples: replacement (default; independent draws, litgpt's torch.randint) "
                   "or epoch (a shuffled loader / DistributedSampler: each rank 1/N of the dataset an epoch, "
                   "without replacement)")


def add_version_arguments(p) -> None:
    """What differs between torch / transformers versions: --attn, optimizer implementation, zero_grad,
    CUDA module loading (a published table of 2022 ran eager attention, for-loop AdamW, kept gradients
    and an eagerly loaded context)."""
    p.add_argument("--attn", choices=["eager", "sdpa", "flash", "triton"],
                   help="transformers attn_implementation: eager (the (L, L) scores kept; transformers < 4.36), "
                        "sdpa (the kernel torch picks for the GPU; default of transformers >= 4.36), "
                        "flash (sdpa with the flash kernel forced), triton (a FlashAttention kernel in Triton, "
                        "as llm-foundry's attn_impl triton: flash's memory, its own speed)")
    p.add_argument("--optimizer-impl", choices=["default", "for-loop", "foreach", "fused"], default="default",
                   help="torch optimizer implementation (default: torch's choice on CUDA, foreach; "
                        "for-loop: torch < 2.0, transformers' adamw_hf and Composer's DecoupledAdamW)")
    p.add_argument("--zero-grad", choices=["none", "zeros"], default="none",
                   help="none: zero_grad(set_to_none=True), torch >= 2.0; zeros: gradients kept between steps, "
                        "zeroed in place (torch < 2.0, transformers' Trainer of then)")
    p.add_argument("--loop-keeps-loss", action="store_true",
                   help="the training loop keeps the last loss (and its autograd graph) until the next step's loss "
                        "replaces it, as litgpt's finetune loops do: what bitsandbytes <= 0.43.1 keeps for a 4-bit "
                        "matmul's backward then lives into the next forward (with --bnb-version)")
    p.add_argument("--module-loading", choices=["lazy", "eager"], default=None,
                   help="CUDA module loading the context size assumes (default: $CUDA_MODULE_LOADING, else lazy; "
                        "eager: every kernel image loaded at start, torch < 1.13 / CUDA < 11.7)")
    p.add_argument("--nccl-connect", choices=["lazy", "eager"], default=None,
                   help="when NCCL connects its rings and trees, for the buffers an N-GPU rank holds outside the "
                        "allocator (default: $NCCL_RUNTIME_CONNECT, else lazy; lazy: NCCL >= 2.22 / torch >= 2.7, "
                        "at an algorithm's first collective; eager: earlier NCCL, all at once)")
    p.add_argument("--softmax-saves-input", action="store_true",
                   help="torch <= 1.10: softmax and log_softmax keep their input for backward next to the "
                        "output (eager attention's (L, L) scores; dropped in torch 1.11, PyTorch PR 65242)")


def version_kwargs(args) -> dict:
    return {"attn": args.attn, "optimizer_impl": args.optimizer_impl, "zero_grad": args.zero_grad,
            "module_loading": args.module_loading, "keep_last_loss": args.loop_keeps_loss,
            "softmax_saves_input": args.softmax_saves_input, "nccl_connect": args.nccl_connect}


def _positive_gbps(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a bandwidth in Gb/s > 0, got {text!r}")
    return value


def add_split_arguments(p) -> None:
    """-n/--nproc and --strategy: one rank's memory when the job runs on N GPUs."""
    p.add_argument("-n", "--nproc", type=positive_int, default=1, metavar="N",
                   help="GPUs the job runs on: the numbers are one rank's (default 1)")
    p.add_argument("--strategy", choices=[s for s in STRATEGIES if s != "pipeline"] + ["zero3", "fsdp1"],
                   default=None,
                   help="how the job is split over the N GPUs (default ddp when -n > 1): ddp, ZeRO-1/2, "
                   "FSDP2 (fsdp = ZeRO-3), fsdp-grad-op, hsdp, fsdp1 (FSDP1 FULL_SHARD with flat parameters, "
                   "as Lightning and accelerate use it); --batch-size is per rank")
    p.add_argument("--fsdp-param-dtype", choices=["bf16"], default=None,
                   help="FSDP2 MixedPrecisionPolicy(param_dtype=...): fp32 shards and optimizer state, parameters "
                   "all-gathered and computed in this dtype, no autocast (torchtitan's default); with --strategy "
                   "fsdp or hsdp; with fsdp1, FSDP1's MixedPrecision (Composer's PURE / DEFAULT presets)")
    p.add_argument("--fsdp-reduce-dtype", choices=["fp32", "bf16"], default=None,
                   help="MixedPrecisionPolicy(reduce_dtype=...): the dtype gradients are reduce-scattered in "
                   "(default fp32, as torchtitan)")
    add_accum_sync_argument(p)
    p.add_argument("--network-gbps", type=_positive_gbps, default=None, metavar="GBPS",
                   help="node-to-node bandwidth of one node, all its NICs together, in Gb/s (speed only; default: "
                   "one InfiniBand NIC per GPU of the GPU's DGX generation)")
    add_compile_argument(p)


def add_mode_arguments(p) -> None:
    """Model-config inputs and training modes (estimate and fit)."""
    p.add_argument("--grad-accum", type=positive_int, default=1, metavar="N",
                   help="gradient accumulation: N micro-batches of --batch-size per optimizer step")
    p.add_argument("--lora", type=positive_int, nargs="?", const=16, metavar="RANK",
                   help="LoRA adapters through peft on every linear layer (rank, default 16); base frozen")
    p.add_argument("--lora-targets", metavar="NAMES", help="LoRA / QLoRA: comma-separated module names to adapt, "
                   "e.g. q_proj,v_proj (litgpt's and torchtune's defaults); default every linear layer")
    p.add_argument("--lora-alpha", type=float, metavar="A", help="LoRA alpha (default 2 x rank)")
    p.add_argument("--lora-dropout", type=float, metavar="P", help="LoRA dropout probability (default 0)")
    p.add_argument("--base-dtype", choices=["fp32", "bf16", "fp16"], help="LoRA: dtype of the frozen base "
                   "weights; default the precision's 16-bit type (peft's usual); fp32 with --precision bf16 is "
                   "Lightning's bf16-mixed; --precision bf16-pure is litgpt's bf16-true (adapters bf16 too); with "
                   "--inference, fp32: float32 weights, each forward under autocast (bf16-mixed generation)")
    p.add_argument("--qlora", action="store_true", help="QLoRA: 4-bit base weights (bitsandbytes) + LoRA")
    p.add_argument("--qlora-quant", choices=["nf4-dq", "nf4", "fp4"], help="--qlora: 4-bit format (default "
                   "nf4-dq: NF4 with double quantization; nf4, fp4: without)")
    p.add_argument("--bnb-version", metavar="X.Y.Z", help="--qlora / --quantize: the bitsandbytes release the run used, "
                   "where its memory differs from the installed one (before 0.43.2 every 4-bit layer kept its input; "
                   "before 0.50 a multi-token inference matmul dequantized its weight to 16 bits)")
    p.add_argument("--qlora-by", choices=["transformers", "lightning"], help="--qlora: who quantizes the base "
                   "(default transformers: every linear layer but the output head; lightning: Fabric's "
                   "BitsandbytesPrecision as litgpt's --quantize bnb.* runs it, the head too, from fp16)")
    add_cross_entropy_argument(p)
    add_train_metrics_argument(p)
    p.add_argument("--freeze", action="append", metavar="REGEX",
                   help="freeze parameters whose name matches (repeatable)")
    p.add_argument("--offload-optimizer", action="store_true", help="optimizer state and step on the CPU")
    p.add_argument("--inference", action="store_true", help="inference instead of training: a no-grad forward, "
                   "or for a causal LM prefill of --seq-len tokens + --new-tokens decode steps with a KV cache")
    p.add_argument("--new-tokens", type=int, default=1, metavar="N", help="--inference: tokens generated (default 1)")
    p.add_argument("--prefill-logits", choices=["last", "all"], default="last", help="--inference: the prompt "
                   "positions the prefill computes logits for (default last, as transformers' generate asks; all: "
                   "litgpt's GPT.forward, transformers before 4.45)")
    p.add_argument("--quantize", choices=["nf4", "nf4-dq", "fp4", "fp4-dq"], help="--inference: bitsandbytes 4-bit "
                   "linear weights (transformers' load_in_4bit, litgpt's --quantize bnb.nf4 / bnb.nf4-dq / bnb.fp4 / "
                   "bnb.fp4-dq); "
                   "--precision bf16/fp16 is the compute dtype")
    p.add_argument("--quantize-by", choices=["transformers", "lightning"], default="transformers",
                   help="--quantize: who quantizes the weights (default transformers: the output head kept 16-bit; "
                   "lightning: Fabric's BitsandbytesPrecision, as litgpt's --quantize bnb.*: every nn.Linear, "
                   "the head too, quantized from float16; as --qlora-by)")


def mode_kwargs(args) -> dict:
    return {"seq_len": args.seq_len, "task": args.task, "target_len": args.target_len, "grad_accum": args.grad_accum,
            "lora": args.lora, "qlora": args.qlora, "freeze": args.freeze, "offload_optimizer": args.offload_optimizer,
            "lora_targets": args.lora_targets, "lora_alpha": args.lora_alpha, "lora_dropout": args.lora_dropout,
            "base_dtype": args.base_dtype, "qlora_quant": args.qlora_quant, "bnb_version": args.bnb_version,
            "qlora_by": args.qlora_by, "cross_entropy": args.cross_entropy,
            "train_metrics": args.train_metrics}


def run(args) -> int:
    refuse_gpu_all(args.gpu, "estimate")
    if (args.quantize or args.quantize_by != "transformers" or args.prefill_logits != "last") and not args.inference:
        raise GpuwiseError("--quantize / --quantize-by / --prefill-logits are for --inference "
                           "(training with 4-bit weights: --qlora)")
    if args.inference and (args.qlora or args.lora or args.qlora_quant):
        raise GpuwiseError("--inference: --lora/--qlora are training modes; 4-bit inference weights: --quantize")
    if args.batch_size is None:
        if not is_config_source(args.workload):
            raise GpuwiseError("-b/--batch-size is required for a workload (a model config or hf: id defaults to 1)")
        args.batch_size = 1
    if args.plot and not Path(args.plot).resolve().parent.is_dir():  # before the trace, not after it
        raise GpuwiseError(f"--plot {args.plot}: the folder {Path(args.plot).resolve().parent} does not exist")
    if args.inference:
        if args.seq_len_dist or args.micro_steps:
            raise GpuwiseError("--seq-len-dist / --micro-steps are for training runs (the run's peak over its steps)")
        if args.nproc > 1 or args.strategy not in (None, "single"):
            raise GpuwiseError("--inference: -n/--strategy are for training (one rank's memory)")
        if args.compile:
            raise GpuwiseError("--compile prices a training step's speed: not with --inference")
        return _run_inference(args)
    with console.err.status("tracing the step with fake tensors…"), StageProgress("estimate") as progress:
        est = estimate(args.workload, args.batch_size, optimizer=args.optimizer, precision=args.precision,
                       checkpointing=args.checkpointing, target=args.target, gpu=args.gpu,
                       margin_pct=DEFAULT_MARGIN_PCT if args.margin is None else args.margin,
                       search_max_batch=not args.no_max_batch, nproc=args.nproc, strategy=args.strategy,
                       layer_checkpointing=args.layer_checkpointing, network_gbps=args.network_gbps,
                       fsdp_param_dtype=args.fsdp_param_dtype, fsdp_reduce_dtype=args.fsdp_reduce_dtype,
                       seq_len_dist=args.seq_len_dist, micro_steps=args.micro_steps,
                       first_batch=args.first_batch, sampling=args.sampling, accum_sync=args.accum_sync,
                       compile=args.compile, on_progress=progress, **mode_kwargs(args), **version_kwargs(args))
    if args.plot:
        try:
            plot_estimate(est, args.plot)
        except (OSError, ValueError) as exc:  # unwritable file, or an extension matplotlib cannot write
            raise GpuwiseError(f"--plot {args.plot}: {exc}") from exc
    if args.json:
        console.emit_json(est.to_dict())
        return 0
    render_estimate(est)
    if args.plot:
        console.err.print(f"chart written to {args.plot}")
    return 0


def _run_inference(args) -> int:
    dtype = {"bf16-pure": "bf16", "tf32": "fp32"}.get(args.precision, args.precision)
    with console.err.status("tracing generation with fake tensors…"):
        est = estimate_inference(args.workload, args.batch_size, args.seq_len, args.new_tokens, dtype,
                                 args.target, args.gpu, quantize=args.quantize, loader=args.quantize_by,
                                 bnb_version=args.bnb_version, prefill_logits=args.prefill_logits,
                                 weights=args.base_dtype)
    if args.json:
        console.emit_json(est.to_dict())
        return 0
    console.out.print(f"inference: {est.workload}  batch {est.batch_size}  context {est.context_len}  "
                      f"+{est.new_tokens} tokens  {est.dtype}  ({est.target})")
    console.out.print(f"  peak allocated {fmt_bytes(est.peak_allocated_bytes)}  device used "
                      f"{fmt_bytes(est.device_used_bytes)}  (weights {fmt_bytes(est.parameters_bytes)}, "
                      f"KV cache {fmt_bytes(est.kv_cache_bytes)}, peak in {est.peak_phase})")
    for note in est.notes[1:]:  # the first says how the weights are held; the others what is not modelled
        console.out.print(f"  note: {note}")
    return 0
