"""`gpuwise.estimate`: a training step's memory, FLOPs and largest batch, predicted without a GPU.

    trace (fake tensors) -> events -> [cuda: + library workspaces -> caching-allocator replay
    -> + context] -> breakdown at the peak -> FLOPs -> roofline and capacity on a named GPU

The JSON form (`Estimate.to_dict()`) is docs/contracts.md's `gpuwise estimate --json` contract; extra keys
(peak phase/op/module, top modules, roofline, curve) follow the contract's keys.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from .. import cpu_isa
from ..devices import discover
from ..errors import GpuwiseError
from ..hf import num_layers_of
from ..optional_libs import sized_without_notes
from ..step import StepConfig, checkpointing_mode
from ..workload import Workload, load_workload
from .capacity import Capacity, find_capacity
from .catalog import GpuSpec, lookup, tensor_core_capability
from .curve import DEFAULT_MARGIN_PCT, CurvePoint
from .flops import Roofline, count_flops, roofline, traffic_bytes
from .inputs import resolve_inputs
from .lengths import apply_run_peak, at_run_lengths
from .memory.allocator import AllocatorResult
from .memory.cuda import CudaMemory, cuda_memory, retries_note
from .memory.events import CATEGORIES, MemoryTrace, check_target, live_peak
from .memory.fsdp_units import block_param_bytes, fsdp_units_of
from .memory.nccl import buffer_bytes, connect_mode, nccl_note
from .memory.overheads import DEFAULT_ARCH, Overheads
from .memory.sharding import rank_trace, trainable_bytes, trainable_tensors
from .memory.split import make_split
from .memory.synth import interpolate, pairing
from .speed.attention import as_gpu_runs
from .speed.comm import link_for_gpu
from .speed.fsdp_kernels import FSDP_KERNELS, with_fsdp_kernels
from .speed.model import Speed, predict
from .tracer import Progress, collector_paused, trace_workload
from .tracing.compiled import compiled_step
from .tracing.modes import apply_modes, make_modes

TOP_MODULES = 8


@dataclass
class Estimate:
    """One step's predicted memory and compute (docs/contracts.md `estimate --json` contract, plus extras)."""

    workload: str
    batch_size: int
    target: str
    optimizer: str
    precision: str
    method: str
    peak_allocated_bytes: int         # cuda: torch.cuda.max_memory_allocated (block sizes); cpu: tensor bytes
    peak_reserved_bytes: int          # cuda: caching-allocator reserved at its steady-state peak; cpu: = allocated
    device_used_bytes: int            # cuda: what nvidia-smi shows for the process; cpu: = allocated
    by_category: dict[str, int]       # tensor bytes live at the peak, per category (all 7 keys)
    flops_per_step: int
    max_batch_size: int | None        # with a GPU: the largest batch whose device_used fits (margin applied)
    gpu: str | None
    checkpointing: bool = False
    peak_phase: str = ""
    peak_op: str = ""
    peak_module: str = ""
    by_module: dict[str, int] = field(default_factory=dict)
    tensor_peak_bytes: int = 0        # live tensor bytes at the peak, before the allocator's rounding
    fits: bool | None = None
    gpu_memory_bytes: int | None = None
    overheads: Overheads | None = None
    allocator: AllocatorResult | None = None
    allocator_free: AllocatorResult | None = None  # the replay with room, when the step runs only by retries
    roofline: Roofline | None = None
    capacity: Capacity | None = None
    speed: Speed | None = None        # predicted step time on the named GPU (plan/speed/model.py)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    grad_accum: int = 1
    effective_batch_size: int = 0     # samples per optimizer step: batch_size x grad_accum
    modes: list[str] = field(default_factory=list)  # training modes applied (LoRA, QLoRA, offload, ...)
    nproc: int = 1                    # GPUs the job runs on; the memory numbers are one rank's
    strategy: str = "single"          # how the job is split over them (plan/memory/split.py)
    accum_sync: str = "last"          # with accumulation: gradients reduced on the last micro-batch or every one
    trace: MemoryTrace | None = field(default=None, repr=False)
    attention: dict[str, Any] | None = None  # cuda: attention implementation, kernels chosen and why
    attention_priced: str | None = None      # why the speed model prices flash calls as another kernel (cuDNN)
    lengths: dict[str, Any] | None = None    # with a length distribution: the run's lengths and peaks (lengths.py)

    def breakdown_at(self, peak) -> None:
        """The breakdown (by category, the peak's phase / op / module, the top modules) of `peak`, a live_peak."""
        self.by_category = dict(peak.by_category)
        self.peak_phase, self.peak_op, self.peak_module = peak.phase, peak.op, peak.module
        self.by_module = dict(list(peak.by_module.items())[:TOP_MODULES])

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {k: getattr(self, k) for k in (
            "workload", "batch_size", "target", "optimizer", "precision", "method", "peak_allocated_bytes",
            "peak_reserved_bytes", "device_used_bytes", "by_category", "flops_per_step", "max_batch_size", "gpu",
            "checkpointing", "peak_phase", "peak_op", "peak_module", "by_module", "tensor_peak_bytes", "fits",
            "gpu_memory_bytes", "notes", "seconds", "grad_accum", "effective_batch_size", "modes", "nproc",
            "strategy", "accum_sync")}
        d["by_category"] = {c: int(self.by_category.get(c, 0)) for c in CATEGORIES}
        if self.overheads is not None:
            o = self.overheads
            d["overheads"] = {"arch": o.arch, "context_bytes": o.context_bytes, "module_loading": o.module_loading,
                              "cudnn_bytes": o.cudnn_bytes, "nccl_bytes": o.nccl_bytes,
                              "workspace_bytes": o.workspace_bytes,
                              "workspaces": [{"name": n, "bytes": b} for n, b in o.workspaces]}
        if self.allocator is not None:
            a = self.allocator
            d["allocator"] = {"segments": a.segments, "fragmentation": a.fragmentation,
                              "max_reserved_bytes": a.max_reserved_bytes, "peak_requested_bytes": a.peak_requested_bytes,
                              "retries": a.retries, "steady_retries": a.steady_retries,
                              "reserved_with_room_bytes": (self.allocator_free or a).max_reserved_bytes}
        if self.roofline is not None:
            d["roofline"] = self.roofline.to_dict()
        if self.capacity is not None:
            d["curve"] = self.capacity.to_dict()
        if self.speed is not None:
            d["speed"] = self.speed.to_dict()
        if self.attention is not None:
            d["attention"] = self.attention
        if self.lengths is not None:
            d["lengths"] = self.lengths
        return d


def _curve_point(batch_size: int, c: CudaMemory) -> CurvePoint:
    """One traced batch for the largest-batch search (plan/capacity.py): totals and each phase's peak."""
    r = c.result
    return CurvePoint(batch_size, r.peak_allocated_bytes, r.peak_reserved_bytes, c.device_used_bytes,
                      dict(r.phase_peak_allocated_bytes), c.overheads.outside_allocator_bytes)


def gpu_capability(spec: GpuSpec | None) -> tuple[int, int] | None:
    """The GPU's compute capability (catalog), which decides the attention kernels; None without a GPU."""
    if spec is None:
        return None
    try:
        major, minor = (spec.compute_capability or "").split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return tensor_core_capability(spec.name)


def resolve_gpu(gpu: str | GpuSpec | None) -> GpuSpec | None:
    """A catalog entry for a name; "auto": the visible GPU with the most free memory (NVML or fake GPUs),
    its capacity being the memory free on it now."""
    if gpu is None or isinstance(gpu, GpuSpec):
        return gpu
    if str(gpu).strip().lower() != "auto":
        spec = lookup(gpu)
        if not spec.modelled:
            raise GpuwiseError(f"{spec.name} ({spec.arch}) is in the catalog for its numbers, but its allocator and "
                               f"context are not modelled: cannot tell; --gpu {spec.memory_bytes / 2**30:.0f}GiB gives "
                               f"the CUDA model against its memory")
        return spec
    found = discover()
    if not found.gpus:
        raise GpuwiseError(f"--gpu auto: no GPU visible ({found.reason or found.backend}); name one, e.g. --gpu H100")
    best = max(found.gpus, key=lambda g: g.memory_free_bytes)
    spec = lookup(best.name)
    return dataclasses.replace(spec, name=f"{best.name} (GPU {best.index}, free now)", memory_bytes=best.memory_free_bytes)


@collector_paused
def estimate(workload: str | Workload | None = None, batch_size: int | None = None, optimizer: str | None = None,
             precision: str = "fp32", checkpointing: bool = False, target: str = "cuda",
             gpu: str | GpuSpec | None = None, *, margin_pct: float = DEFAULT_MARGIN_PCT,
             search_max_batch: bool = True, optimizer_impl: str = "default",
             model: Any = None, batch: Any = None, loss: Any = None, seq_len: int | None = None,
             task: str | None = None, target_len: int | None = None, grad_accum: int = 1,
             lora: int | bool | None = None, qlora: bool = False,
             freeze: Any = None, offload_optimizer: bool = False, nproc: int = 1, strategy: str | None = None,
             lora_targets: Any = None, lora_alpha: float | None = None, lora_dropout: float | None = None,
             base_dtype: str | None = None, qlora_quant: str | None = None, bnb_version: str | None = None,
             qlora_by: str | None = None, cross_entropy: str | None = None, train_metrics: int = 0,
             attn: str | None = None,
             zero_grad: str = "none",
             module_loading: str | None = None, keep_last_loss: bool = False,
             softmax_saves_input: bool = False, nccl_connect: str | None = None,
             layer_checkpointing: int | None = None, on_progress: Progress | None = None,
             network_gbps: float | None = None, fsdp_param_dtype: str | None = None,
             fsdp_reduce_dtype: str | None = None, seq_len_dist: Any = None,
             micro_steps: int | None = None, accum_sync: str | None = None,
             first_batch: str = "longest", sampling: str = "replacement", compile: bool = False) -> Estimate:
    """Predict the memory and compute of one steady-state training step of `workload` at `batch_size`.

    `workload`: a workload file / module / `examples:NAME`, `hf:ORG/NAME` or a config.json (built with
    random weights under fake tensors; `seq_len`, `task` and a sequence-to-sequence LM's `target_len` apply),
    or leave it out and pass `model=` (a module, possibly on the meta device), `batch=` (a function batch(batch_size) or one example
    batch) and optionally `loss=`. Modes (plan/tracing/modes.py): `grad_accum`, `lora` (rank, or True for 16),
    `qlora`, `freeze` (parameter-name regexes), `offload_optimizer`; for LoRA / QLoRA `lora_targets` (module
    names, default all linear layers), `lora_alpha`, `lora_dropout`, `base_dtype` (fp32 / bf16 / fp16: the
    frozen base's storage), `qlora_quant` (nf4-dq, nf4, fp4), `bnb_version` (the bitsandbytes release
    to emulate where its memory differs: plan/tracing/bnb_versions.py) and `qlora_by` ("transformers" /
    "lightning": who quantizes the base, plan/tracing/modes.py QLORA_BY). `cross_entropy` ("model", "fused",
    "chunked", "fused-linear"): a causal LM's loss as the model computes it, as flash-attn's fused cross-entropy,
    torchtune's chunked loss or Liger's fused linear cross-entropy does (plan/tracing/losses.py); `train_metrics`
    N: Composer's training metrics, N cross-entropies over the logits after each micro-batch's backward. `nproc` GPUs split by `strategy`
    (ddp, zero1, zero2, fsdp, fsdp-grad-op, hsdp; ddp by default over nproc > 1): one rank's memory, the
    single-GPU trace transformed (plan/memory/sharding.py), `batch_size` per rank.

    The setting of a torch / transformers version: `attn` ("eager" / "sdpa" / "flash": transformers'
    attn_implementation; the SDPA kernel follows the GPU, plan/tracing/sdpa.py), `optimizer_impl`
    ("for-loop" / "foreach" / "fused"; default: torch's choice for CUDA, foreach), `zero_grad` ("none" /
    "zeros": gradients kept between steps, torch < 2.0), `module_loading` ("lazy" / "eager": the CUDA
    context with every kernel image loaded, torch < 1.13; default CUDA_MODULE_LOADING, else lazy),
    `softmax_saves_input` (torch <= 1.10: softmax and log_softmax keep their input for backward,
    plan/tracing/torch_versions.py), `nccl_connect` ("lazy": NCCL >= 2.22, PyTorch >= 2.7, connects an algorithm at
    its first collective; "eager": earlier NCCL connects rings and trees at once; default NCCL_RUNTIME_CONNECT,
    else lazy): a rank's NCCL buffers over `nproc` > 1 GPUs (plan/memory/nccl.py), outside the allocator.
    The setting of a training loop: `keep_last_loss` (the loop keeps the last loss, and its autograd graph,
    until the next step's loss replaces it, as litgpt's finetune loops do: what a custom autograd Function
    keeps in ctx, bitsandbytes <= 0.43.1's 4-bit matmul input, then lives into the next forward).

    `target="cuda"` replays the trace through the caching-allocator model and adds library workspaces
    and the CUDA context (for `gpu`'s architecture; Hopper when no GPU is named). With `gpu`, also a
    roofline bound and the largest batch that fits with `margin_pct` percent of its memory kept free.
    `fsdp_param_dtype` ("bf16") / `fsdp_reduce_dtype` ("fp32", "bf16"): FSDP2's MixedPrecisionPolicy (with
    strategy fsdp / hsdp): the step is traced with bf16 weights and no autocast, the rank's shards are fp32.
    `accum_sync` ("last" / "every", plan/memory/split.py ACCUM_SYNCS): with `grad_accum` over `nproc` > 1,
    whether the gradients are reduced on the last micro-batch only (no_sync; the default) or on every one
    (Composer under FSDP): memory (FSDP: unsharded or sharded gradients between micro-batches) and speed.
    With `gpu`, `speed` is the predicted step (plan/speed/model.py); `nproc` and `strategy` set its
    communication (plan/speed/overlap.py). `layer_checkpointing` N (torchtitan's layer-level selective
    checkpointing: every N-th block checkpointed) adds that recomputation to the predicted speed only;
    the memory is modelled as without it (an upper bound). `compile`: the model runs under torch.compile: its
    forward's and backward's memory-bound ops priced as a fusing compiler runs them (plan/speed/fusion.py), in
    the predicted speed only; the memory is eager's.
    `seq_len_dist` (a `plan/lengths.py` LengthDist or a length file) and `micro_steps` (forward + backward
    iterations per rank): a dataset of varying lengths, each micro-batch padded to its longest sample; the
    peaks are the run's, the larger of the first micro-step at the longest sample and the later ones at the
    expected longest padded length they reach (plan/lengths.py); `first_batch` "random": no forced longest
    first step, every step at the expected longest padded length of all of them; `sampling` "epoch": each
    rank draws its share of the dataset each epoch without replacement (DistributedSampler), not with. Without them every step is at the
    workload's (or `seq_len`'s) length: for a dataset of varying lengths traced at its longest, an upper bound.
    `on_progress(stage)` is called as each stage starts (the CLI shows it on stderr for long estimates).
    """
    started = time.perf_counter()
    checkpointing = checkpointing_mode(checkpointing)
    source = workload
    workload, batch_size = resolve_inputs(workload, batch_size, model, batch, loss,
                                          None if seq_len_dist is not None else seq_len, task, target_len)
    run_len = first_wl = None
    if seq_len_dist is not None or micro_steps is not None:
        if first_batch not in ("longest", "random") or sampling not in ("replacement", "epoch"):
            raise GpuwiseError(f"--first-batch {first_batch!r} / --sampling {sampling!r}: expected longest or "
                               "random / replacement or epoch")
        run_len, workload, first_wl = at_run_lengths(seq_len_dist, micro_steps, batch_size, source, workload,
                                                     seq_len, task, longest_first=first_batch == "longest",
                                                     ranks=nproc if sampling == "epoch" else None, target_len=target_len)
    modes = make_modes(grad_accum, lora, qlora, freeze, offload_optimizer, lora_targets=lora_targets,
                       lora_alpha=lora_alpha, lora_dropout=lora_dropout, base_dtype=base_dtype,
                       qlora_quant=qlora_quant, bnb_version=bnb_version, qlora_by=qlora_by,
                       cross_entropy=cross_entropy, train_metrics=train_metrics)
    check_target(target)
    split = make_split(nproc, strategy, param_dtype=fsdp_param_dtype, reduce_dtype=fsdp_reduce_dtype,
                       accum_sync=accum_sync)
    if split.param_dtype:  # MixedPrecisionPolicy: the step runs 16-bit weights without autocast
        if precision != "fp32":
            raise GpuwiseError(f"--fsdp-param-dtype {split.param_dtype}: the model's weights are fp32 and FSDP2 "
                               f"casts them; leave --precision at fp32 (got {precision})")
        precision = f"{split.param_dtype}-pure"
    if split.strategy == "pipeline":
        raise GpuwiseError("--strategy pipeline: estimate does not split the layers into stages; `gpuwise fit -n N` "
                           "ranks pipeline options")
    spec = resolve_gpu(gpu)
    connect = connect_mode(nccl_connect)
    nccl = buffer_bytes(split, link_for_gpu(spec.id if spec is not None else "h100-sxm"), connect) if target == "cuda" else 0
    if spec is not None and target != "cuda":
        raise GpuwiseError("a GPU was named but the target is 'cpu': use target='cuda' (--target cuda) with --gpu")
    if not 0 <= margin_pct < 100:
        raise GpuwiseError(f"margin must be a percentage in [0, 100), got {margin_pct!r}")
    config = StepConfig(optimizer=optimizer, precision=precision, checkpointing=checkpointing,
                        optimizer_impl=optimizer_impl, zero_grad=zero_grad, keep_last_loss=keep_last_loss,
                        softmax_saves_input=softmax_saves_input)
    base = load_workload(workload)
    wl = apply_modes(base, modes, config.precision)

    from .tracing.sdpa import AttentionTarget, attention_summary, attention_target, using_target

    with attention_target(attn=attn):  # validates attn
        pass
    capability = gpu_capability(spec)
    attention = AttentionTarget(capability or (9, 0), spec.name if spec is not None else "", attn)
    cfg = getattr(base, "hf_config", None)
    layers = num_layers_of(cfg) if cfg is not None else None

    def one_gpu(b: int, residual=None) -> MemoryTrace:
        with using_target(attention):
            return trace_workload(base, b, config, target, repeat=True, progress=on_progress, modes=modes,
                                  residual=residual)

    units = fsdp_units_of(base) if split.strategy in ("fsdp", "hsdp") and split.nproc > 1 else None

    def per_rank(t: MemoryTrace) -> MemoryTrace:
        return (rank_trace(t, split, block_param_bytes(t, layers), units, accumulating=modes.grad_accum > 1)
                if split.nproc > 1 else t)

    whole = one_gpu(batch_size)  # the job on one GPU: the speed model's communicated bytes are its

    def traced(b: int) -> MemoryTrace:
        """The step at another batch for the largest-batch search (its memory only): a deep model's blocks
        checked at -b (its `block_residual`) are not checked again (a 4-block trace less at each batch, as fit's
        searches do; plan/tracing/repeat.py `repeated_trace`)."""
        return per_rank(one_gpu(b, getattr(whole, "block_residual", None)))

    trace = per_rank(whole)
    notes = list(trace.notes) + sized_without_notes(config.optimizer, modes.adapters)
    arch = spec.arch if spec is not None else DEFAULT_ARCH
    opt_name = config.optimizer or ("workload optimizer()" if wl.optimizer_fn is not None else "adamw")

    flops = int(getattr(trace, "flops_per_step", 0) or 0)
    if not flops:
        counted = count_flops(wl, batch_size)
        if counted:
            flops = counted
            notes.append("FLOPs counted on meta tensors (forward + backward)")

    limit = int(spec.memory_bytes * (1 - margin_pct / 100)) if spec is not None else None  # device bytes to stay under
    if target == "cpu":
        peak = live_peak(trace)
        isa = cpu_isa.onednn_isa()
        notes.append(f"cpu: oneDNN kernels on {isa or 'an unknown ISA'} (ONEDNN_MAX_CPU_ISA respected); convolutions and "
                     "bf16/fp16 matrix products were run once here for their scratch, so another CPU may differ")
        est = Estimate(wl.spec, batch_size, target, opt_name, config.precision, trace.method, peak.allocated_bytes,
                       peak.allocated_bytes, peak.allocated_bytes, dict(peak.by_category), flops, None, None,
                       checkpointing, tensor_peak_bytes=peak.allocated_bytes)
    else:
        if on_progress is not None:
            on_progress("replaying the caching allocator")
        cuda = cuda_memory(trace, arch, module_loading, limit, nccl_bytes=nccl)
        peak = live_peak(cuda.trace, round_to=512)  # breakdown in allocator-rounded sizes, workspaces included
        if spec is None:
            notes.append(f"no GPU named: context and workspaces of a {arch} GPU assumed")
        if nccl:
            notes.append(nccl_note(nccl, connect))
        if cuda.overheads.cudnn_bytes:
            notes.append("cuDNN's per-call convolution workspaces are not in this peak (their size depends on the "
                         "engine its heuristics pick): measured on an H200, a small fp32 VGG-style convnet peaked at "
                         "2.5x the prediction, large nets within 2 % (docs/cuda-target.md 'Library workspaces')")
        est = Estimate(wl.spec, batch_size, target, opt_name, config.precision, trace.method,
                       cuda.result.peak_allocated_bytes, cuda.result.peak_reserved_bytes, cuda.device_used_bytes,
                       dict(peak.by_category), flops, None, spec.name if spec else None, checkpointing,
                       tensor_peak_bytes=live_peak(trace).allocated_bytes, overheads=cuda.overheads,
                       allocator=cuda.result, allocator_free=cuda.free)
        if cuda.free is not None:
            notes.append(retries_note(cuda))
    est.breakdown_at(peak)
    est.trace = trace
    if run_len is not None:
        def first_trace() -> MemoryTrace:
            with using_target(attention):
                return per_rank(trace_workload(load_workload(first_wl), batch_size, config, target, repeat=True,
                                               progress=on_progress, modes=modes))

        apply_run_peak(est, run_len, first_trace, arch, module_loading, limit)
        if spec is not None and search_max_batch:
            notes.append(f"run lengths: the largest batch is searched at the later micro-steps' "
                         f"{run_len.later or run_len.first} tokens; the first micro-step at the longest sample "
                         "only at -b")

    est.grad_accum, est.effective_batch_size, est.modes = modes.grad_accum, batch_size * modes.grad_accum, modes.describe()
    est.nproc, est.strategy = split.nproc, "fsdp1" if split.flat_params else split.strategy
    est.accum_sync = split.accum_sync
    if modes.grad_accum > 1:  # the trace ran min(N, 2) micro-steps: scale to N
        flops = est.flops_per_step = flops * modes.grad_accum // modes.traced_micro_steps
    if spec is not None:
        est.gpu_memory_bytes = spec.memory_bytes
        if spec.bandwidth_bytes_per_s > 0:
            est.roofline = roofline(flops, traffic_bytes(est.by_category), batch_size * modes.grad_accum, spec,
                                    config.precision)
            est.speed = _speed(whole, est, spec, wl, modes, config.precision, split.nproc, split.strategy,
                               str(layer_checkpointing) if layer_checkpointing else None, attention.attn,
                               network_gbps, split.reduce_factor, split.sync_every_micro_step,
                               split if split.strategy in FSDP_KERNELS and split.nproc > 1 else None, compile)
        else:
            notes.append(f"{spec.name}: memory only (no FLOP/s or bandwidth given): no roofline")
        if search_max_batch:
            first = _curve_point(batch_size, cuda)
            traces = {batch_size: trace}
            pairs: dict[tuple[int, int], dict[int, int] | None] = {}

            def point(b: int) -> CurvePoint:
                if on_progress is not None:
                    on_progress(f"largest batch: batch {b}")
                traces[b] = traced(b)
                return _curve_point(b, cuda_memory(traces[b], arch, module_loading, limit, nccl_bytes=nccl))

            def replayed(b: int, a: int, c: int) -> CurvePoint | None:
                if (a, c) not in pairs:
                    pairs[(a, c)] = pairing(traces[a], traces[c])
                if pairs[(a, c)] is None:
                    return None
                return _curve_point(b, cuda_memory(interpolate(traces[a], a, traces[c], c, b, pairs[(a, c)]), arch,
                                                   module_loading, limit, nccl_bytes=nccl))

            est.capacity = find_capacity(point, batch_size, spec.memory_bytes, margin_pct, first=first,
                                         replayed=replayed)
            est.max_batch_size = est.capacity.max_batch_size
            if not est.capacity.settled:
                notes.append("largest-batch search stopped at its trace budget: max_batch_size is a lower bound")
        est.fits = est.device_used_bytes <= limit
    if target == "cuda":
        est.attention = attention_summary(attention)
        if est.attention_priced:  # the trace's flash tensors, the speed of the kernel the GPU runs (speed/attention.py)
            est.attention["priced_as"] = {"flash": "cudnn"}
            est.attention["why"].append(est.attention_priced)
    est.notes = notes + est.notes  # after the trace's notes, those the speed model added (_speed)
    est.seconds = round(time.perf_counter() - started, 3)
    return est


def _speed(trace: MemoryTrace, est: Estimate, spec: GpuSpec, wl: Workload, modes, precision: str, nproc: int,
           strategy: str, selective: str | None = None, attn: str | None = None,
           network_gbps: float | None = None, reduce_factor: int = 1, sync_every: bool = False,
           fsdp: Any = None, compile: bool = False) -> Speed | None:
    """The step-time model over the traced ops (plan/speed/); None when the trace recorded none. `attn`
    "triton": the flash calls are priced as the Triton FlashAttention kernel. `reduce_factor`: the reduced
    gradients' bytes over the traced ones (2: MixedPrecisionPolicy reduces bf16 gradients in fp32).
    `sync_every`: the gradients are reduced on every micro-batch (--accum-sync every). `fsdp`: the Split of
    an FSDP job, whose copies, casts and divisions around the collectives are added (plan/speed/fsdp1.py for
    FSDP1's flat parameters, fsdp2.py for fully_shard). `compile`: the forward and backward as torch.compile
    fuses them (OpCosts.compiled), as for a workload whose model is compiled already; FSDP's own kernels stay
    eager."""
    costs = trace.op_costs
    if costs is None:
        est.notes.append("no per-op record (the trace fell back): no speed prediction")
        return None
    if attn == "triton":
        costs = costs.relabel_attention("flash", "triton")
    costs, why = as_gpu_runs(costs, gpu_capability(spec), attn)
    if why:
        est.attention_priced = why
        est.notes.append(f"attention speed: {why}")
    if modes.grad_accum > modes.traced_micro_steps:
        costs = costs.scaled(modes.grad_accum / modes.traced_micro_steps)
    if compile or compiled_step(trace.notes):  # asked, or the workload's model is
        costs = costs.compiled()
        est.notes.append("torch.compile: the forward's and backward's memory-bound ops priced as fused kernels "
                         "(speed only; the memory is eager's)")
    grad_bytes = reduce_factor * trainable_bytes(trace)
    cfg = getattr(wl, "hf_config", None)
    blocks = int(getattr(cfg, "num_hidden_layers", 0) or getattr(cfg, "n_layer", 0) or 1)
    if fsdp is not None:
        costs = with_fsdp_kernels(costs, fsdp, grad_bytes // reduce_factor, precision, modes.grad_accum, blocks,
                                  trainable_tensors(trace))
    params = (est.by_category if nproc == 1 else live_peak(trace, round_to=512).by_category).get("parameters", 0)
    gathered = params // 2 if precision in ("bf16", "fp16") else params  # FSDP2 gathers in param_dtype
    seq_len = getattr(wl, "seq_len", None)
    if selective:
        est.notes.append(f"layer checkpointing every {selective} blocks: recomputation in the predicted speed only; "
                         "memory modelled without it (an upper bound)")
    return predict(costs, spec, precision, samples_per_rank=est.batch_size * modes.grad_accum,
                   flops_per_step=est.flops_per_step, tokens_per_sample=seq_len, nproc=nproc, strategy=strategy,
                   grad_bytes=grad_bytes, param_bytes=gathered, blocks=blocks,
                   roofline_step_s=est.roofline.time_s if est.roofline else None, selective=selective,
                   network_gbps=network_gbps, micro_steps=modes.grad_accum, sync_every=sync_every)
