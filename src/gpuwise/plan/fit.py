"""`gpuwise fit`: will this job fit on that GPU (or N of them), and which changes make it fit or go faster.

Each option is a set of changes to the job (precision, activation checkpointing, optimizer, LoRA /
QLoRA, offload, gradient accumulation, sharding over N GPUs); gpuwise traces the changed step (the
real libraries, fake tensors; plan/scaled.py rebuilds a 7B model from 3- and 4-block traces as estimate does) and
reports, per rank: device memory as nvidia-smi would show it, a samples/s bound, the effective batch,
what changes in the training's numerics, and the code to write. The JSON form is docs/contracts.md's
`gpuwise fit --json` contract. Options that fit come first, fastest first.

Speed = effective batch x data-parallel ranks / step time, where the step time is the speed model's
prediction over the traced ops (plan/speed/: GEMMs, attention kernels, memory-bound bytes, launches,
NCCL collectives overlapped as DDP / FSDP schedule them; the recomputation of checkpointing is in the
traced ops), never under the roofline bound (plan/flops.py); for offload, PCIe traffic and a
host-memory-bound CPU optimizer step are added. With a number of tokens or samples to train on,
plan/fit_gpus.py `attach_costs` gives each GPU's time and cost (plan/speed/cost.py: renting and owning);
`--gpu all` is plan/fit_gpus.py `fit_all_gpus`.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..bracket import search
from ..errors import GpuwiseError
from ..optional_libs import install_hint, missing
from ..step import StepConfig
from .catalog import GpuSpec, lookup
from .curve import DEFAULT_MARGIN_PCT
from .estimate import gpu_capability, resolve_gpu
from .fit_options import (
    NOTES,
    Variant,
    blocks_code,
    changes_of,
    estimate_args,
    heavy_logits,
    needed,
    notes_of,
    source_args,
    train_args,
    untraceable_without,
    variants,
)
from .flops import roofline, traffic_bytes
from .inputs import resolve_inputs
from .memory.cuda import retries_note
from .memory.nccl import buffer_bytes, connect_mode
from .memory.split import Split, comm_bytes_per_step, make_split
from .point import Point
from .scaled import Evaluator
from .side_by_side import Untraced, side_by_side
from .speed.attention import as_gpu_runs
from .speed.comm import link_for_gpu
from .speed.cost import TrainingCost
from .speed.fsdp_kernels import FSDP_KERNELS, with_fsdp_kernels
from .speed.model import predict
from .tracer import collector_paused
from .tracing.compiled import compiled_step
from .tracing.modes import TrainingModes

GB = 1e9
# Per-direction GPU-to-GPU bandwidth. NVLink: H100/H200 SXM NVLink4 900 GB/s total (450 each way), A100
# SXM NVLink3 600 GB/s (300), V100 SXM2 NVLink2 300 GB/s (150) (NVIDIA datasheets). Cards without
# NVLink go through PCIe: Gen5 x16 64 GB/s, Gen4 x16 32 GB/s per direction (PCI-SIG), at ~80% in practice.
LINK_BYTES_PER_S = {"h100-sxm": 450 * GB, "h200": 450 * GB, "a100-40gb": 300 * GB, "a100-80gb": 300 * GB,
                    "v100-16gb": 150 * GB, "v100-32gb": 150 * GB, "h100-pcie": 0.8 * 64 * GB}
NO_SPEED = "speed: cannot tell on a GPU known by its memory alone (no FLOP/s or bandwidth): samples/s 0"
PCIE_BYTES_PER_S = 0.8 * 32 * GB            # PCIe Gen4 x16, ~80% of 32 GB/s: host <-> GPU (offload)
HOST_MEMORY_BYTES_PER_S = 50 * GB           # assumption: a server's sustained DRAM bandwidth for CPU Adam
CPU_ADAM_BYTES_PER_PARAM = 28               # fp32 p, g, m, v read (16) + p, m, v written (12)


@dataclass
class FitOption:
    name: str
    changes: dict[str, Any]
    fits: bool
    device_used_bytes: int
    samples_per_s: float
    effective_batch_size: int
    notes: list[str]
    micro_batch_size: int = 1
    grad_accum: int = 1
    step_time_s: float = 0.0
    estimate_cmd: str | None = None  # `gpuwise estimate ...` of this option: one rank's step as estimate sees it
    train_cmd: str | None = None     # `gpuwise train ...` that runs this option (None: train does not run it)
    needs: list[str] = field(default_factory=list)  # packages to install to run it (base install)
    sized: bool = True   # False: not traced (cannot tell): a needed package is missing, or the tracer cannot run it
    extrapolated: bool = False  # its numbers are the labelled fallback (Point.extrapolate), not estimate's
    floor_only: bool = False    # not traced: its memory is a floor already over the card (state_floor)
    # the search's trials in the order it asked them: (micro-batch, fits, device bytes), the whole-depth
    # trace of an extrapolated answer included (`best_micro_batch`); not in the JSON contract
    trials: list[tuple[int, bool, int]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = {"name": self.name, "changes": self.changes, "fits": self.fits,
             "device_used_bytes": self.device_used_bytes, "samples_per_s": round(self.samples_per_s, 3),
             "effective_batch_size": self.effective_batch_size, "notes": self.notes,
             "estimate_cmd": self.estimate_cmd, "train_cmd": self.train_cmd}
        if self.needs:  # only on an install without peft / bitsandbytes
            d["needs"] = install_hint(self.needs)
        if self.needs or not self.sized:  # not traced (cannot tell): docs/contracts.md
            d["sized"] = self.sized
        return d


@dataclass
class FitResult:
    workload: str
    gpu: str
    nproc: int
    gpu_memory_bytes: int
    batch_size: int
    options: list[FitOption]
    seconds: float = 0.0
    traces: int = 0
    tokens_per_sample: int | None = None
    cost: TrainingCost | None = None   # time and money of the fastest fitting option (attach_costs)

    def to_dict(self) -> dict[str, Any]:
        """docs/contracts.md `gpuwise fit --json` contract (+ `cost` when a training length was given)."""
        d = {"workload": self.workload, "gpu": self.gpu, "nproc": self.nproc,
             "options": [o.to_dict() for o in self.options]}
        if self.cost is not None:
            d["cost"] = self.cost.to_dict()
        return d

    @property
    def fitting(self) -> list[FitOption]:
        return [o for o in self.options if o.fits]


def _step_time_s(point: Point, v: Variant, spec: GpuSpec, samples: int, nproc: int, blocks: int = 1,
                 compile: bool = False) -> float:
    """One rank's step: the speed model over the traced ops (plan/speed/model.py) where the trace recorded
    them, else the roofline bound plus the split's communication; pipeline bubble and offload added. 0.0 on a GPU
    known by its memory alone (`--gpu 24GiB`: no FLOP/s or bandwidth): the speed cannot be told. `compile`, or a
    workload whose model is compiled: the forward and backward as torch.compile fuses them (as estimate prices)."""
    if spec.bandwidth_bytes_per_s <= 0:
        return 0.0
    rl = roofline(point.flops_per_step, traffic_bytes(point.by_category), samples, spec, v.config.precision)
    if point.op_costs is not None:
        costs, _ = as_gpu_runs(point.op_costs, gpu_capability(spec))  # flash calls the GPU runs as cuDNN
        if compile or compiled_step(point.notes):
            costs = costs.compiled()
        if v.split.strategy in FSDP_KERNELS and v.split.nproc > 1:  # as estimate prices them (its estimate_cmd)
            costs = with_fsdp_kernels(costs, v.split, point.trainable_bytes, v.config.precision, v.modes.grad_accum,
                                      blocks, point.trainable_tensors)
        shards = v.split.shards if v.split.strategy in ("fsdp", "hsdp") else 1
        params = point.by_category.get("parameters", 0) * shards
        gathered = params // 2 if v.config.precision in ("bf16", "fp16") else params
        strategy = v.split.strategy if v.split.nproc > 1 else "single"
        t = predict(costs, spec, v.config.precision, samples_per_rank=samples,
                    flops_per_step=point.flops_per_step, nproc=v.split.nproc, strategy=strategy,
                    grad_bytes=point.trainable_bytes, param_bytes=gathered, blocks=blocks,
                    roofline_step_s=rl.time_s, micro_steps=v.modes.grad_accum,
                    sync_every=v.split.sync_every_micro_step).step_time_s
    else:
        t = rl.time_s
        link = LINK_BYTES_PER_S.get(spec.id, 0.8 * 32 * GB)
        params_16 = point.trainable_bytes // 2 if v.config.precision != "bf16-pure" else point.trainable_bytes
        comm = comm_bytes_per_step(v.split, params_16, point.by_category.get("activations", 0)) / link
        t = max(t, comm)  # overlapped with backward at best
    if v.split.strategy == "pipeline" and v.split.nproc > 1:  # GPipe/1F1B bubble with m micro-batches
        m = max(samples // max(point_micro(point, samples), 1), 1)
        t *= (m + v.split.nproc - 1) / m
    if v.modes.offload_optimizer:
        params = point.trainable_bytes // 4 or 1
        t += 2 * 2 * params / PCIE_BYTES_PER_S + CPU_ADAM_BYTES_PER_PARAM * params / HOST_MEMORY_BYTES_PER_S
    return t


def point_micro(point: Point, samples: int) -> int:
    return getattr(point, "micro_batch", samples)


def batch_divisors(n: int) -> list[int]:
    """The divisors of `n`, largest first (the micro-batches a batch of `n` can be split into)."""
    return sorted({d for d in range(1, n + 1) if n % d == 0}, reverse=True)


@collector_paused
def fit(workload: Any, gpu: str | GpuSpec, nproc: int = 1, batch_size: int = 8, *, precision: str = "fp32",
        optimizer: str | None = None, checkpointing: bool = False, seq_len: int | None = None,
        task: str | None = None, target_len: int | None = None, margin_pct: float = DEFAULT_MARGIN_PCT,
        evaluator: Evaluator | None = None,
        source: str | None = None, progress: Callable[[str], None] | None = None,
        accum_sync: str | None = None, cross_entropy: str = "model", train_metrics: int = 0,
        compile: bool = False) -> FitResult:
    """Rank the ways to run `workload` at `batch_size` samples per optimizer step (per rank) on `nproc`
    x `gpu`: options that fit first, fastest first. Each option carries `estimate_cmd`, the `gpuwise
    estimate` command of its step (`source`: the workload as the command line names it, when `workload`
    is already loaded). `progress` is told each option as its sizing starts. `accum_sync` ("last" / "every",
    plan/memory/split.py ACCUM_SYNCS): how the multi-GPU options reduce gradients under accumulation.
    `cross_entropy` (plan/tracing/losses.py): a causal LM's loss in every option; `train_metrics`: Composer's
    training metrics over its logits in every option. `compile`: every option's speed as torch.compile runs the
    model (estimate's --compile, carried into each `estimate_cmd`)."""
    started = time.perf_counter()
    if progress is not None:
        progress("loading the workload and its libraries")
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise GpuwiseError(f"-n must be a positive integer, got {nproc!r}")
    spec = resolve_gpu(gpu) if not isinstance(gpu, GpuSpec) else gpu
    if spec is None:
        spec = lookup(str(gpu))
    wl, batch_size = resolve_inputs(workload, batch_size, seq_len=seq_len, task=task, target_len=target_len)
    ev = evaluator or Evaluator(wl, spec.arch)
    ev.arch, ev.capability = spec.arch, gpu_capability(spec)  # estimate's replay and attention kernels
    ev.compile = compile
    named = source_args(source if source is not None else workload, ev.wl)
    gpu_arg = gpu if isinstance(gpu, str) else spec.id
    options = []
    limit, candidates, floors, whole = candidates_on(ev, spec, nproc, precision, optimizer, checkpointing, margin_pct,
                                                   accum_sync, cross_entropy, train_metrics)
    side = f"{spec.name}: the options' traces, side by side"
    told = None if progress is None else lambda r: progress(f"{side}, {r}")
    if progress is not None:
        progress(side)
    _side_by_side(ev, searched_variants(candidates, floors, whole), spec, batch_size, limit, told)
    for i, v in enumerate(candidates, 1):
        lacking = missing(untraceable_without(v))
        if lacking:  # listed, not sized: the trace needs the library itself
            options.append(_unsized(v, batch_size, lacking, _blocks(ev, v)))
            continue
        if v.name in floors:  # cannot fit at any micro-batch: no trace
            option = _floored(v, batch_size, floors[v.name], limit, _blocks(ev, v))
            option.needs = missing(needed(v))
            options.append(_with_commands(option, v, named, gpu_arg, margin_pct, compile))
            continue
        needs = missing(needed(v))
        if progress is not None:
            progress(f"{spec.name}: option {i}/{len(candidates)}, {v.name}")
        try:
            option = best_micro_batch(ev, v, spec, batch_size, limit, whole[v.name])
        except GpuwiseError as exc:
            if needs:
                options.append(_unsized(v, batch_size, needs, _blocks(ev, v)))  # a stand-in does not cover this model
                continue
            if v.name == "as given":
                raise  # the job itself cannot be traced: one line, exit 2
            # a change the tracer cannot run for this model on this GPU: listed, not sized (cannot tell)
            failed = _unsized(v, batch_size, [], _blocks(ev, v))
            failed.notes[0] = f"not sized: {exc}"
            options.append(failed)
            continue
        option.needs = needs
        options.append(_with_commands(option, v, named, gpu_arg, margin_pct, compile))
    options.sort(key=lambda o: (not o.fits, not o.sized, -o.samples_per_s if o.fits else o.device_used_bytes))
    name = ev.wl.spec if hasattr(ev.wl, "spec") else str(workload)
    return FitResult(name, spec.name, nproc, spec.memory_bytes, batch_size, options,
                     round(time.perf_counter() - started, 3), ev.traces_run, getattr(ev.wl, "seq_len", None))


def candidates_on(ev: Evaluator, spec: GpuSpec, nproc: int, precision: str, optimizer: str | None, checkpointing: bool,
                margin_pct: float, accum_sync: str | None,
                cross_entropy: str = "model",
                train_metrics: int = 0) -> tuple[float, list[Variant], dict[str, int], dict[str, bool]]:
    """`fit`'s variants on `spec`: the usable bytes, the variants, the floors of those that cannot fit at any
    micro-batch (not traced), and whether each is searched whole batch first (`_whole_first`)."""
    limit = spec.memory_bytes * (1 - margin_pct / 100)
    adapters = getattr(ev.wl, "hf_config", None) is not None
    accum_sync = make_split(nproc, None if nproc > 1 else "single", accum_sync=accum_sync).accum_sync
    candidates = variants(spec, nproc, precision, optimizer, checkpointing, adapters, accum_sync, cross_entropy,
                          heavy_logits(ev.wl, spec.memory_bytes), train_metrics)
    floor_of = {v.name: state_floor(ev, v) for v in candidates}
    floors = {name: f for name, f in floor_of.items() if f is not None and f > limit}
    whole = {v.name: _whole_first(v, floor_of[v.name], limit) for v in candidates}
    return limit, candidates, floors, whole


def searched_variants(candidates: list[Variant], floors: dict[str, int], whole: dict[str, bool]) -> list[tuple[Variant, bool]]:
    """The variants whose largest micro-batch is searched (traced), each with its `whole_first`."""
    return [(v, whole[v.name]) for v in candidates if not missing(untraceable_without(v)) and v.name not in floors]


def _with_commands(option: FitOption, v: Variant, named: list[str] | None, gpu_arg: str,
                   margin_pct: float, compile: bool = False) -> FitOption:
    """`option` with its `estimate_cmd` and `train_cmd` (none for a workload the command line cannot name)."""
    args = estimate_args("SOURCE", gpu_arg, v, option.micro_batch_size, option.grad_accum, margin_pct)
    if args is not None and compile:
        args = args + ["--compile"]
    if args is not None and named is not None:
        i = args.index("SOURCE")
        option.estimate_cmd = shlex.join(args[:i] + named + args[i + 1:])
    train = train_args(named, v, option.micro_batch_size, option.grad_accum) if named is not None else None
    option.train_cmd = shlex.join(train) if train is not None else None
    return option


# optimizer state per parameter in units of the weight's bytes (torch's Adam / AdamW: exp_avg and exp_avg_sq,
# zeros_like the parameter), or in bytes (8-bit AdamW: two uint8 states; 32-bit ones for small tensors)
STATE_PER_WEIGHT = {"adam": 2, "adamw": 2, "momentum": 1, "adagrad": 1, "rmsprop": 1}
STATE_BYTES = {"adamw8bit": 2}


def state_floor(ev: Evaluator, v: Variant) -> int | None:
    """Bytes one rank holds at the end of every backward, whatever the micro-batch, for a full fine-tune
    that shards nothing (one GPU or DDP) of a model config: every parameter, its gradient and the
    optimizer's state of it, in the step's weight dtype (fp32 master weights; bf16 under bf16-pure); no
    state for an optimizer not in the tables above (the workload's own, Adafactor) or offloaded. The
    optimizer steps after backward, so a trace never holds less (tests/test_plan_fit.py). None where this
    is not a floor (adapters, frozen parts, sharding, a pipeline stage) or the workload is not a model config."""
    if v.modes.adapters or v.modes.freeze or v.split.strategy not in ("single", "ddp"):
        return None
    count = ev.parameter_count()
    if count is None:
        return None
    weight = 2 if v.config.precision == "bf16-pure" else 4
    state = 0
    if not v.modes.offload_optimizer and v.config.optimizer is not None:
        state = STATE_PER_WEIGHT.get(v.config.optimizer, 0) * weight + STATE_BYTES.get(v.config.optimizer, 0)
    return count * (2 * weight + state)


def _blocks(ev: Evaluator, v: Variant) -> str:
    """The blocks `v`'s FSDP code shards: the model's own (built on meta once), where `v` is FSDP."""
    units = ev.units(v.split) if "fsdp" in v.keys else None
    return blocks_code(units.blocks_paths if units is not None else None)


def _floored(v: Variant, batch: int, floor: int, limit: float, blocks: str) -> FitOption:
    """A variant whose parameters, gradients and optimizer state alone exceed the card: does not fit, not traced; its
    memory is that floor (its `estimate_cmd` gives the exact number) and its speed is not predicted."""
    note = (f"not traced: its parameters, gradients and optimizer state alone take {floor / GB:.1f} GB, over the "
            f"{limit / GB:.1f} GB usable, at any micro-batch (memory shown: that floor; estimate_cmd gives the exact number)")
    notes = [note] + [NOTES[k] for k in v.keys if k in NOTES]
    if batch > 1:
        notes.append(NOTES["accum"].format(k=batch, m=1))
    return FitOption(v.name if batch == 1 else f"{v.name} + accumulation {batch}x1",
                     changes_of(v, 1, batch, v.split.nproc, blocks), False, floor, 0.0, batch * v.split.data_parallel, notes, 1, batch, floor_only=True)


def _unsized(v: Variant, batch: int, lacking: list[str], blocks: str) -> FitOption:
    needs = missing(needed(v))
    note = f"not sized: tracing it needs {' and '.join(lacking)} ({install_hint(needs)})"
    return FitOption(v.name, changes_of(v, batch, 1, v.split.nproc, blocks), False, 0, 0.0, batch * v.split.data_parallel,
                     [note] + [NOTES[k] for k in v.keys if k in NOTES], batch, 1, needs=needs, sized=False)


def _side_by_side(ev: Evaluator, searches: list[tuple[Variant, bool]], spec: GpuSpec, batch: int,
                  limit: float, progress: Callable[[str], None] | None = None) -> None:
    """Run the variants' searches (`best_micro_batch`, with `whole_first` each) side by side: each search runs
    over the traces kept until it asks one not kept yet; that trial of every search is handed to forked workers
    (one per idle CPU), and each time one comes back the searches run again, until no search asks a trace the
    workers run. The searches are the same and ask the same trials as one by one (each search's next trial
    depends only on its own earlier ones), so the answers are too; only when the traces run differs. With one
    idle CPU no worker runs: the searches trace as they ask."""
    side_by_side(ev, [(spec, limit, v, whole) for v, whole in searches], batch, best_micro_batch, every_gpu=False,
                 progress=progress)


def _option(ev: Evaluator, v: Variant, spec: GpuSpec, micro: int, accum: int, limit: float,
            whole: bool = False, ready: bool = False) -> FitOption:
    """`v` at `micro` x `accum`. `ready`: over the traces kept only (raises `Untraced` where it needs another)."""
    if ready:
        traced = ev.traced(*_ask(v, micro, accum), whole=whole)
        if not traced:
            raise Untraced(_ask(v, micro, accum) + ((True,) if whole else ()) if traced is False else None)
    point = ev.evaluate(*_ask(v, micro, accum), whole=whole)
    point.micro_batch = micro  # type: ignore[attr-defined]
    nccl = buffer_bytes(v.split, link_for_gpu(spec.id), connect_mode())  # a rank's NCCL buffers, as estimate's
    point.device_used_bytes += nccl
    if point.device_used_bytes > limit >= point.peak_allocated_bytes:  # it may run by freeing the cache
        capped = ev.under_limit(point, int(limit), nccl)
        if capped is not None:
            point.device_used_bytes = capped.device_used_bytes
            point.notes.append(retries_note(capped))
    samples = micro * accum
    t = _step_time_s(point, v, spec, samples, v.split.nproc, ev.layers or 1, getattr(ev, "compile", False))
    sps = samples * v.split.data_parallel / t if t > 0 else 0.0
    name = v.name if accum == 1 else f"{v.name} + accumulation {accum}x{micro}"
    notes = notes_of(v, micro, accum, point)
    if t <= 0:
        notes.insert(0, NO_SPEED)
    return FitOption(name, changes_of(v, micro, accum, v.split.nproc, _blocks(ev, v)), point.device_used_bytes <= limit,
                     point.device_used_bytes, sps, samples * v.split.data_parallel, notes, micro, accum, t,
                     extrapolated=point.extrapolated)


def _whole_first(v: Variant, floor: int | None, limit: float) -> bool:
    """Whether the search asks the whole batch first: for adapters (LoRA, QLoRA: the trained state is a sliver
    of the model, the batch's activations decide) and for a full fine-tune whose parameters, gradients and
    optimizer state (`state_floor`) take at most half the card (the activations are likely to fit beside
    them). Only the traces run depend on it, not the answer."""
    return v.modes.adapters or (floor is not None and floor <= limit / 2)


def best_micro_batch(ev: Evaluator, v: Variant, spec: GpuSpec, batch: int, limit: float,
                      whole_first: bool = False, ready: bool = False) -> FitOption:
    """The largest micro-batch (a divisor of `batch`, the rest accumulated) that fits, by the one
    largest-batch loop (bracket.search) over the divisors in ascending order: micro-batch 1 first, then the
    whole batch, then the divisor the two predict (memory is about linear in the batch), then
    bisection. When micro-batch 1 does not fit, no accumulated micro-batch does, but the whole batch still may:
    memory is not monotone there. Accumulation keeps the gradients of the micro-batches before through each
    later forward (beside, under autocast, the 16-bit weight copies that forward builds), which one batch
    without accumulation never holds: Llama-2-7B bf16 + checkpointing on an H200 takes 144.0 GB at 1 x 8, over
    the card, and 138.1 GB at 8 x 1. So the whole batch is asked too (two traces for the variants that cannot
    fit). With `whole_first` (`_whole_first`: adapters, or a full fine-tune whose state takes at most half
    the card) the whole batch is asked first: when that fits, micro-batch 1 does too (the
    same premise as above) and is not traced; when it does not, the divisors below it are bisected from
    the middle (micro-batch 1 last); the answer is the same in either order, only the traces run differ. The answer is traced and fits, and the next larger divisor is traced and does not (the
    rule estimate's largest batch keeps). A fitting answer that was extrapolated (the rebuild does not
    cover the step) is traced whole, as its `estimate_cmd` is, and stepped down if it then does not fit.
    `ready`: the search over the traces kept only, up to the first trial that needs another (`_side_by_side`)."""
    best = _searched(ev, v, spec, batch, limit, whole_first=whole_first, ready=ready)
    if not best.fits or not best.extrapolated:
        return best
    # the answer of a step the rebuild does not cover: traced whole, as its estimate_cmd traces it (the
    # extrapolation only led the search); the next smaller divisor where that does not fit
    trials = best.trials
    for m in sorted((d for d in batch_divisors(batch) if d <= best.micro_batch_size), reverse=True):
        exact = _option(ev, v, spec, m, batch // m, limit, whole=True, ready=ready)
        trials = trials + [(m, exact.fits, exact.device_used_bytes)]
        if exact.fits or m == 1:
            exact.trials = trials
            return exact
    return best


def _ask(v: Variant, micro: int, accum: int) -> tuple[int, StepConfig, TrainingModes, Split]:
    """What `evaluate` (and `Forks.submit`) gets for `v` at `micro` x `accum`: micro-batch, step, modes, split."""
    return micro, v.config, replace(v.modes, grad_accum=accum), v.split


def _searched(ev: Evaluator, v: Variant, spec: GpuSpec, batch: int, limit: float,
              whole_first: bool = False, ready: bool = False) -> FitOption:
    divisors = sorted(batch_divisors(batch))        # index k (1-based) -> the k-th smallest divisor
    tried: dict[int, FitOption] = {}
    asked: list[int] = []                      # the trials in the order they were asked

    def answer(k: int) -> FitOption:
        tried[k].trials = [(divisors[j - 1], tried[j].fits, tried[j].device_used_bytes) for j in asked]
        return tried[k]

    def trial(k: int) -> bool:
        if k not in tried:
            m = divisors[k - 1]
            try:
                tried[k] = _option(ev, v, spec, m, batch // m, limit, ready=ready)
                asked.append(k)
            except Untraced as untraced:
                above = (k + n) // 2
                if whole_first and k == n // 2 and above not in (k, n):  # the bisection's first step: should
                    untraced.then = [_ask(v, divisors[above - 1], batch // divisors[above - 1])]  # it fit, this
                raise
        return tried[k].fits

    n = len(divisors)
    if whole_first and trial(n):
        return answer(n)
    if whole_first and n > 1:
        # the whole batch does not fit: bisect below it (micro-batch 1 is asked only when 2 does not fit)
        found = search(trial, n, limit=n, smallest_fail=n)
        return answer(found.largest_ok or 1)
    if not trial(1) or n == 1:
        return answer(n) if n > 1 and trial(n) else answer(1)  # the whole batch holds no accumulated gradients
    if trial(n):
        return answer(n)
    per_sample = (tried[n].device_used_bytes - tried[1].device_used_bytes) / max(batch - 1, 1)
    predicted = [k for k in range(2, n) if tried[1].device_used_bytes + per_sample * (divisors[k - 1] - 1) <= limit]
    guess = max(predicted) if predicted else 2
    found = search(trial, n, limit=n, largest_ok=1, smallest_fail=n, guess=guess if guess < n else None)
    return answer(found.largest_ok or 1)
