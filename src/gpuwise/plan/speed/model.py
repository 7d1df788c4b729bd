"""The step-time model: price each traced op on a GPU, add communication and host dispatch.

    step = the GPU's finish when the host issues forward, backward and optimizer in turn (launch.py step_s:
           each phase ends when its kernels have run and the host has issued them), + exposed communication
    GPU time = forward + backward + optimizer kernels (GEMMs: gemm.py; fused attention: attention.py;
               convolutions: conv.py; batch norm: batchnorm.py; everything else: memory_bound.py; + a gap
               per kernel: launch.py) + the batch's host-to-device copy (transfer.py) + exposed communication + compute slowed by the SMs NCCL holds
               while it overlaps (overlap.py over comm.py)

The roofline (plan/flops.py) stays beside it as the bound: the predicted step is never shorter.
`mfu` = FLOPs of the step / (step time x peak FLOP/s), FLOPs as traced (recomputation included).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...errors import GpuwiseError
from ..catalog import GpuSpec, speed_spec
from . import launch
from .attention import attention_peak, attention_s, computed_head_dim
from .batchnorm import batch_norm_s
from .conv import conv_s, depthwise_s
from .gemm import gemm_s
from .memory_bound import memory_bound_s
from .ops import OpCosts
from .overlap import comm_time
from .transfer import input_copy_s

PARTS = ("matmul", "attention", "memory_bound", "batch_norm", "input_copy", "communication", "optimizer",
         "launch_overhead")


@dataclass
class Speed:
    step_time_s: float
    samples_per_s: float                 # all ranks together (data-parallel ranks x samples per rank)
    tokens_per_s_per_gpu: float | None   # sequence models
    mfu: float
    breakdown: dict[str, float]
    bound_by: str
    nproc: int = 1
    strategy: str = "single"
    roofline_step_s: float | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"step_time_s": self.step_time_s, "samples_per_s": self.samples_per_s,
                "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "mfu": self.mfu,
                "breakdown": dict(self.breakdown), "bound_by": self.bound_by, "nproc": self.nproc,
                "strategy": self.strategy, "roofline_step_s": self.roofline_step_s, "notes": list(self.notes)}


def peak_for(gpu: GpuSpec, itemsize: int, precision: str) -> float:
    """Peak FLOP/s of a GEMM with `itemsize`-byte operands: 2 bytes -> bf16/fp16 tensor cores; 4 bytes ->
    TF32 only when asked (`--precision tf32`; torch's default for fp32 matmul is full fp32)."""
    if itemsize <= 2:
        return gpu.peak_flops("bf16" if gpu.flops.get("bf16") and precision != "fp16" else "fp16")
    return gpu.peak_flops("tf32" if precision == "tf32" else "fp32")


def recompute_parts(forward: dict[str, float], selective: str | None) -> dict[str, float]:
    """Forward work redone in backward under torchtitan's selective activation checkpointing
    (torchtitan/distributed/activation_checkpoint.py):
        "op"  op-level SAC: outputs of mm and SDPA are saved "except every second mm" (`mm_count % 2 == 0`
              recomputes); every other op is recomputed -> half the forward matmuls + all memory-bound
              ops and their launches
        "N"   layer-level SAC: every N-th transformer block is wrapped in full checkpointing -> 1/N of the forward
    """
    if not selective:
        return {}
    if selective == "op":
        return {"matmul": 0.5 * forward.get("matmul", 0.0), "memory_bound": forward.get("memory_bound", 0.0),
                "launch_overhead": forward.get("launch_overhead", 0.0)}
    try:
        every = int(selective)
    except ValueError:
        every = 0
    if every < 1:
        raise GpuwiseError(f"selective checkpointing {selective!r}: 'op' or a layer frequency N >= 1")
    return {part: seconds / every for part, seconds in forward.items()}


def predict(costs: OpCosts, gpu: GpuSpec, precision: str, *, samples_per_rank: int, flops_per_step: float,
            tokens_per_sample: int | None = None, nproc: int = 1, strategy: str = "single",
            grad_bytes: float = 0, param_bytes: float = 0, blocks: int = 1,
            roofline_step_s: float | None = None, selective: str | None = None,
            network_gbps: float | None = None, micro_steps: int = 1, sync_every: bool = False) -> Speed:
    """Predicted steady-state step of one rank on `gpu` (see the module docstring). `selective`: selective
    activation checkpointing the trace did not run, added as backward recomputation (`recompute_parts`).
    `micro_steps`, `sync_every`: gradient accumulation's micro-batches and whether each one reduces the
    gradients (overlap.py `comm_time`)."""
    sp = speed_spec(gpu)
    bw = gpu.bandwidth_bytes_per_s
    half_peak = peak_for(gpu, 2, precision)
    tf32_peak = gpu.flops.get("tf32", 0.0) if precision == "tf32" else 0.0  # convolutions: see conv.py
    phases: dict[str, dict[str, float]] = {}

    def add(phase: str, part: str, seconds: float) -> None:
        group = "optimizer" if phase not in ("forward", "backward") else phase
        phases.setdefault(group, {}).setdefault(part, 0.0)
        phases[group][part] += seconds

    for (phase, batch, m, n, k, itemsize, *aligned), calls in costs.gemms.items():
        add(phase, "matmul", calls * gemm_s(batch, m, n, k, itemsize, peak_for(gpu, itemsize, precision),
                                            sp.sm_count, sp.gemm_efficiency(itemsize), bw * sp.memory_efficiency,
                                            aligned=aligned[0] if aligned else True))
    shaped: dict[tuple, float] = {}  # attention FLOPs priced by their problem shape (attention.py shape_factor)
    for (phase, kernel, itemsize, seq_q, seq_k, head_dim, causal), flops in costs.attention_shapes.items():
        peak = attention_peak(gpu, itemsize, half_peak)
        padded = flops * computed_head_dim(kernel, head_dim) / head_dim if head_dim else flops
        add(phase, "attention", attention_s(padded, kernel, phase, gpu.arch, peak, (seq_q, seq_k, causal)))
        shaped[(phase, kernel, itemsize)] = shaped.get((phase, kernel, itemsize), 0.0) + flops
    for key, flops in costs.attention.items():
        phase, kernel, *itemsize = key
        rest = flops - shaped.get(key, 0.0)  # calls of unknown shape: the kernel's long-sequence fraction
        if rest > 1e-9 * flops:
            peak = attention_peak(gpu, itemsize[0] if itemsize else 2, half_peak)
            add(phase, "attention", attention_s(rest, kernel, phase, gpu.arch, peak))
    for (phase, flops, nbytes, nchw_bytes, itemsize), calls in costs.convs.items():
        add(phase, "matmul", calls * conv_s(flops, nbytes, nchw_bytes, itemsize, half_peak, tf32_peak,
                                            gpu.peak_flops("fp32"), sp.gemm_efficiency(itemsize), bw,
                                            sp.memory_efficiency, gpu.arch))
    for (phase, pass_, flops, nbytes, itemsize), calls in costs.depthwise.items():
        add(phase, "matmul", calls * depthwise_s(flops, nbytes, pass_, itemsize, gpu.peak_flops("fp32"), bw,
                                                 sp.memory_efficiency))
    for key, nbytes in costs.memory_bytes.items():
        phase, path = key if isinstance(key, tuple) else (key, "vectorized")
        add(phase, "memory_bound", memory_bound_s(nbytes, bw, sp.memory_efficiency, path))
    for (phase, impl), nbytes in costs.batch_norms.items():
        add(phase, "batch_norm", batch_norm_s(nbytes, impl, sp.sm_count, bw, sp.memory_efficiency))
    for phase, nbytes in costs.input_bytes.items():
        add(phase, "input_copy", input_copy_s(nbytes))
    for phase, kernels in costs.kernels.items():
        add(phase, "launch_overhead", launch.gpu_gaps_s(kernels))

    forward_kernels = {part: s for part, s in phases.get("forward", {}).items() if part != "input_copy"}
    for part, seconds in recompute_parts(forward_kernels, selective).items():
        add("backward", part, seconds)
    # ZeRO / FSDP shard the optimizer state: each rank updates 1/N of the parameters (same kernel count)
    shards = {"zero1": nproc, "zero2": nproc, "fsdp": nproc, "zero3": nproc, "fsdp-grad-op": nproc,
              "hsdp": min(nproc, 8)}.get(strategy, 1)
    if shards > 1:
        opt = phases.get("optimizer", {})
        for part in opt:
            if part != "launch_overhead":
                opt[part] /= shards
    fwd_s = sum(phases.get("forward", {}).values())
    bwd_s = sum(phases.get("backward", {}).values())
    opt_s = sum(phases.get("optimizer", {}).values())
    plan = comm_time(strategy, nproc, sp.link, grad_bytes, param_bytes, fwd_s, bwd_s, blocks,
                     network_gbps=network_gbps, sm_count=sp.sm_count, micro_steps=micro_steps,
                     sync_every=sync_every)
    gpu_s = fwd_s + bwd_s + opt_s + plan.exposed_s + plan.contention_s
    # a pageable copy first waits for the stream and blocks the host until staged (transfer.py): both timelines
    # start after it; then the host issues each phase while the GPU runs what it was given (launch.py)
    copy_s = sum(input_copy_s(b) for b in costs.input_bytes.values())
    conv_calls: dict[str, float] = {}
    for (phase, *_shape), calls in costs.convs.items():
        conv_calls[phase] = conv_calls.get(phase, 0.0) + calls
    host = launch.host_phases_s(costs.host_ops, conv_calls)
    step_s = launch.step_s({"forward": fwd_s - copy_s, "backward": bwd_s, "optimizer": opt_s}, host, copy_s) \
        + plan.exposed_s + plan.contention_s
    host_excess_s = max(0.0, step_s - gpu_s)

    breakdown = dict.fromkeys(PARTS, 0.0)
    for group in ("forward", "backward"):
        for part, seconds in phases.get(group, {}).items():
            breakdown[part] += seconds
    breakdown["optimizer"] = opt_s
    breakdown["communication"] = plan.exposed_s + plan.contention_s  # waits + compute slowed by NCCL's SMs
    breakdown["launch_overhead"] += host_excess_s  # the GPU waiting for the host
    notes = []
    if sp.sustained_efficiency is not None and any(k[5] <= 2 for k in costs.gemms):
        notes.append(f"16-bit GEMMs at the sustained matmul rate, {sp.sustained_efficiency:.1%} of peak (MSMF: a "
                     f"training run's power-saturated clock; a short burst on a cool GPU runs them up to "
                     f"{sp.matmul_efficiency / sp.sustained_efficiency - 1:.0%} faster)")
    if roofline_step_s is not None and step_s < roofline_step_s:
        notes.append("the op model came under the roofline bound: the bound is taken")
        step_s = roofline_step_s
    if host_excess_s > 1e-9:
        notes.append(f"host-bound: Python/dispatch of {sum(costs.host_ops.values()):.0f} ops keeps the GPU waiting "
                     f"{host_excess_s * 1e3:.2f} ms")
    data_parallel = 1 if strategy == "pipeline" else max(nproc, 1)
    samples_per_s = samples_per_rank * data_parallel / step_s if step_s > 0 else 0.0
    tokens = samples_per_rank * tokens_per_sample / step_s if tokens_per_sample and step_s > 0 else None
    peak = half_peak if precision in ("bf16", "fp16", "bf16-pure") else peak_for(gpu, 4, precision)
    mfu = flops_per_step / (step_s * peak) if step_s > 0 and peak else 0.0
    return Speed(step_s, samples_per_s, tokens, mfu, breakdown, max(breakdown, key=breakdown.get), nproc,
                 strategy, roofline_step_s, notes)
