"""Diagnosis rules: a registry of small pure functions `Summary -> Finding | None` (monitoring/result.py).

Each finding carries the measured numbers behind it (`evidence`) and a concrete change (`fix`).
The thresholds are this project's judgement, not vendor numbers; each says why next to it. Add a rule
with `@rule("kind")`; `diagnose(summary)` runs them all in registration order.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

from ..units import fmt_bytes, fmt_duration
from .result import Summary


@dataclass(frozen=True)
class Finding:
    kind: str
    evidence: str
    fix: str
    severity: str = "warning"  # warning: costs speed now; info: healthy or an opportunity

    def to_dict(self) -> dict:
        return asdict(self)


RULES: dict[str, Callable[[Summary], Finding | None]] = {}


def rule(kind: str):
    def deco(fn):
        RULES[kind] = fn
        return fn
    return deco


def diagnose(summary: Summary | dict, rules: dict[str, Callable[[Summary], Finding | None]] | None = None) -> list[Finding]:
    """Every rule's finding on `summary` (a Summary, or a summary dict such as `mon.summary()` returns)."""
    if isinstance(summary, dict):
        summary = Summary.from_dict(summary)
    found = []
    for fn in (rules or RULES).values():
        f = fn(summary)
        if f is not None:
            found.append(f)
    return found


# Thresholds (judgement calls, tuned on the synthetic loops in tests/test_monitor_*.py):
DATA_WAIT_FRACTION = 0.15    # above this the loader visibly costs throughput
OSCILLATION_FRACTION = 0.15  # >= this share of samples idle AND >= this share busy: the 0% -> 99% -> 0% pattern
LOW_UTIL_MEAN_PCT = 50.0     # a GPU busy less than half the time while data is not the cause
COPY_FRACTION = 0.05         # host-to-device copies worth overlapping
LOW_MEMORY_FRACTION = 0.5    # less than half the GPU memory used: room for a larger batch
COMPUTE_FRACTION = 0.8       # the step is the bottleneck, not its inputs
RANK_SPREAD = 1.10           # slowest rank's median step >= 10% above the fastest's
WORKER_HEADROOM = 1.25       # workers to keep ahead of the GPU despite jitter (one in four spare)
IO_BOUND_BUSY_FRACTION = 0.75  # a loader running or runnable (schedstat) < 3/4 of the time the step waits sleeps
                               # on I/O: CPU-bound decoding measured 0.95-1.0 on a shared 2-core machine, a sleeping
                               # loader 0.56 when overloaded (each wake-up queues for a core)
LOW_UTIL_PCT_TXT = "10%"     # summary.LOW_UTIL_PCT, as text
HIGH_UTIL_PCT_TXT = "90%"    # summary.HIGH_UTIL_PCT


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _is_gpu(s: Summary) -> bool:
    return s.on_gpu


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def suggest_num_workers(step_s: float, data_s: float, num_workers: int | None, cpu_count: int | None = None) -> int:
    """Workers needed so the loader keeps up: one worker makes a whole batch, taking `per_batch` seconds.

    With W workers and a data-bound loop, W batches take `per_batch` and arrive one per step, so
    `per_batch ~= W * step_s`; with W = 0 the main process loads, so `per_batch ~= data_s`. The step
    without waiting is `step_s - data_s`; workers needed = per_batch / that, with 25% headroom, and at
    least one more than now. With `cpu_count`, capped at cpu_count - 1 (one core stays with training).
    """
    busy_s = max(step_s - data_s, 1e-6)
    per_batch_s = data_s if not num_workers else num_workers * step_s
    needed = max(math.ceil(per_batch_s / busy_s * WORKER_HEADROOM), (num_workers or 0) + 1)
    return needed if cpu_count is None else min(needed, max(cpu_count - 1, 1))


@rule("data_starvation")
def data_starvation(s: Summary) -> Finding | None:
    wait = s.data_wait_fraction
    util = s.utilization or {}
    oscillating = util.get("samples", 0) >= 5 and util.get("low_fraction", 0) >= OSCILLATION_FRACTION \
        and util.get("high_fraction", 0) >= OSCILLATION_FRACTION
    if not (_num(wait) and wait >= DATA_WAIT_FRACTION) and not oscillating:
        return None
    if _num(wait) and wait < DATA_WAIT_FRACTION / 2 and oscillating:
        return None  # the loop hardly waits: the oscillation has another cause (cpu_bound, syncs)
    step = (s.step_time_s or {}).get("median")
    data = ((s.split or {}).get("data_wait_s") or {}).get("median")
    parts = []
    if _num(wait):
        parts.append(f"{_pct(wait)} of step time waits for the next batch"
                     + (f" (median {fmt_duration(data)} of a {fmt_duration(step)} step)" if _num(data) and _num(step) else ""))
    if oscillating:
        parts.append(f"GPU utilisation oscillates: <= {LOW_UTIL_PCT_TXT} in {_pct(util['low_fraction'])} of "
                     f"{util['samples']} samples, >= {HIGH_UTIL_PCT_TXT} in {_pct(util['high_fraction'])}")
    loader = s.loader or {}
    workers = loader.get("num_workers")
    cpus = (s.host or {}).get("cpu_count")
    fixes = []
    if _num(step) and _num(data):
        needed = suggest_num_workers(step, data, workers, None)
        # Measured while the step waits (gpuwise.bootstrap): the share of a core the loading process(es)
        # used. Decoding that keeps a core busy is CPU-bound (workers beyond the cores do not help);
        # loading that hardly uses the CPU waits on I/O (storage, network), where more workers do.
        busy = loader.get("cpu_busy_fraction")
        io_bound = _num(busy) and busy < IO_BOUND_BUSY_FRACTION
        n = suggest_num_workers(step, data, workers, None if io_bound else cpus)
        now = f"now {workers}" if workers is not None else "now unknown"
        who = "the main process" if not workers else f"each of the {workers} workers"
        if not _num(busy):
            why = "; cannot tell whether loading is CPU- or I/O-bound (not measured), so capped at the CPUs"
        elif io_bound:
            why = f"; loading waits on I/O: {who} ran or was ready to run only {_pct(busy)} of the time the step waited"
        else:
            why = f"; loading is CPU-bound: {who} ran or was ready to run {_pct(busy)} of the time the step waited"
        if n > (workers or 0):
            fixes.append(f"{_workers_fix(s, n)} ({now}; {cpus} CPUs{why})")
        if needed > n:
            fixes.append(f"keeping up needs ~{needed} workers, more than this machine's {cpus} CPUs: make samples "
                         "cheaper (pre-decode / cache / smaller inputs) or move augmentation to the GPU")
    else:
        fixes.append("more DataLoader workers (num_workers); run the script with gpuwise.monitor for a number")
    if _is_gpu(s) and loader.get("pin_memory") is not True:
        fixes.append("pin_memory=True")
    if workers and loader.get("persistent_workers") is not True:
        fixes.append("persistent_workers=True (workers restart every epoch otherwise)")
    command = s.command
    if command:
        fixes.append(f"or measure the best settings with `gpuwise tune -- {' '.join(command)}`")
    else:
        fixes.append("or measure the best settings with `gpuwise tune WORKLOAD`")
    return Finding("data_starvation", "; ".join(parts), "; ".join(fixes))


def _workers_fix(s: Summary, n: int) -> str:
    """The change in the user's own terms: their framework's setting where it has one."""
    framework = s.framework
    if framework == "transformers":
        return f"TrainingArguments(dataloader_num_workers={n})"
    if framework == "lightning":
        return f"DataLoader(num_workers={n}) in the LightningModule / DataModule's train_dataloader()"
    return f"DataLoader(num_workers={n})"


@rule("cpu_bound")
def cpu_bound(s: Summary) -> Finding | None:
    util = s.utilization or {}
    wait = s.data_wait_fraction
    if not _is_gpu(s) or util.get("samples", 0) < 5 or not _num(wait) or wait >= DATA_WAIT_FRACTION:
        return None
    if util["mean_pct"] >= LOW_UTIL_MEAN_PCT:
        return None
    host = s.host or {}
    evidence = (f"GPU busy {util['mean_pct']:.0f}% on average ({util['samples']} samples) although the loop waits "
                f"for data only {_pct(wait)} of the time")
    if _num(host.get("process_cpu_mean_pct")):
        evidence += f"; the training process uses {host['process_cpu_mean_pct']:.0f}% CPU (100% = one core)"
    step = (s.step_time_s or {}).get("median")
    if _num(step):
        evidence += f"; median step {fmt_duration(step)}"
    return Finding("cpu_bound", evidence,
                   "the host cannot issue GPU work fast enough (Python overhead, many small kernels, syncs): "
                   "raise the batch size, torch.compile(model) (mode='reduce-overhead' uses CUDA graphs), "
                   "a foreach/fused optimizer, and avoid .item()/.cpu() every step")


@rule("unpinned_copy")
def unpinned_copy(s: Summary) -> Finding | None:
    copy = s.copy_fraction
    pinned = s.pinned_fraction
    loader = s.loader or {}
    if not _is_gpu(s) or not _num(copy) or copy < COPY_FRACTION:
        return None
    if pinned == 1.0 or (pinned is None and loader.get("pin_memory") is True):
        return None
    copy_s = ((s.split or {}).get("copy_s") or {}).get("median")
    nbytes = s.batch_bytes
    evidence = f"host-to-device copies take {_pct(copy)} of step time"
    if _num(copy_s) and copy_s > 0 and _num(nbytes):
        evidence += f" (median {fmt_duration(copy_s)} for {fmt_bytes(nbytes)}: {nbytes / copy_s / 1e9:.1f} GB/s)"
    if _num(pinned):
        evidence += f"; {_pct(pinned)} of the batches checked were in pinned memory"
    return Finding("unpinned_copy", evidence,
                   "DataLoader(pin_memory=True) and batch.to(device, non_blocking=True) (mon.to_device does this), "
                   "so that the copy runs from page-locked memory and overlaps compute")


@rule("low_memory_use")
def low_memory_use(s: Summary) -> Finding | None:
    mem = s.memory or {}
    frac, total = mem.get("use_fraction"), mem.get("device_total_bytes")
    if not _is_gpu(s) or not _num(frac) or not _num(total) or frac >= LOW_MEMORY_FRACTION:
        return None
    used = frac * total
    evidence = f"peak memory {fmt_bytes(used)} of {fmt_bytes(total)} ({_pct(frac)})"
    batch = s.batch_size
    planned = mem.get("planner_max_batch_size")
    if _num(planned):
        fix = f"raise the batch size: the planner's largest batch on this GPU is {planned} (now {batch})"
    elif _num(batch) and batch:
        # Conservative: assumes all memory grows with the batch (weights and optimizer state do not).
        guess = int(batch * 0.9 * total / used)
        fix = (f"raise the batch size: at least ~{guess} should fit (now {batch}, scaling the peak linearly); "
               "`gpuwise estimate WORKLOAD --gpu NAME` gives the largest batch")
    else:
        fix = "raise the batch size (`gpuwise estimate WORKLOAD --gpu NAME` gives the largest that fits)"
    return Finding("low_memory_use", evidence, fix + "; scale the learning rate with it", severity="info")


@rule("precision")
def precision(s: Summary) -> Finding | None:
    cap = s.capability
    prec = s.precision
    if not _is_gpu(s) or not cap or tuple(cap) < (7, 0) or prec != "fp32":
        return None
    name = s.device_name or "this GPU"
    if tuple(cap) >= (8, 0):
        fix = ("torch.autocast('cuda', dtype=torch.bfloat16) around forward and loss (no GradScaler needed), or at "
               "least torch.set_float32_matmul_precision('high') for TF32; compare with `gpuwise tune --precision`")
    else:
        fix = "torch.autocast('cuda', dtype=torch.float16) with torch.amp.GradScaler (no bf16 before compute capability 8.0)"
    return Finding("precision", f"{name} (compute capability {cap[0]}.{cap[1]}, tensor cores) runs the step in "
                   "fp32 with TF32 off: matmuls use the slow non-tensor-core path", fix)


@rule("rank_imbalance")
def rank_imbalance(s: Summary) -> Finding | None:
    ranks = [r for r in s.ranks or [] if _num(r.get("step_time_s_median"))]
    if len(ranks) < 2:
        return None
    slow = max(ranks, key=lambda r: r["step_time_s_median"])
    fast = min(ranks, key=lambda r: r["step_time_s_median"])
    waits = [r["data_wait_fraction"] for r in ranks if _num(r.get("data_wait_fraction"))]
    wait_spread = max(waits) - min(waits) if waits else 0.0
    ratio = slow["step_time_s_median"] / max(fast["step_time_s_median"], 1e-9)
    if ratio < RANK_SPREAD and wait_spread < DATA_WAIT_FRACTION:
        return None
    per = ", ".join(f"rank {r['rank']} {fmt_duration(r['step_time_s_median'])}"
                    + (f" ({_pct(r['data_wait_fraction'])} data wait)" if _num(r.get("data_wait_fraction")) else "")
                    for r in ranks)
    return Finding("rank_imbalance", f"median step per rank: {per}; slowest/fastest = {ratio:.2f}",
                   f"the other ranks wait for rank {slow['rank']} at every all-reduce: check its GPU (`gpuwise gpus`: "
                   "other processes, clocks), give every rank the same number of samples per step "
                   "(DistributedSampler, drop_last=True) and enough loader workers")


@rule("compute_bound")
def compute_bound(s: Summary) -> Finding | None:
    comp, wait = s.compute_fraction, s.data_wait_fraction
    if not _num(comp) or comp < COMPUTE_FRACTION or (_num(wait) and wait >= DATA_WAIT_FRACTION):
        return None  # a loader costing >= 15% is data_starvation's case
    util = s.utilization or {}
    if _is_gpu(s) and util.get("samples", 0) >= 5 and util["mean_pct"] < LOW_UTIL_MEAN_PCT:
        return None  # compute time that does not keep the GPU busy: that is cpu_bound's case
    evidence = f"{_pct(comp)} of step time is compute; the input pipeline keeps up"
    if util.get("samples"):
        evidence += f"; GPU busy {util['mean_pct']:.0f}% on average"
    if _is_gpu(s):
        fix = "nothing to fix in the input pipeline; for more speed try a lower precision or a larger batch (`gpuwise tune`)"
    else:
        fix = "the step runs on the CPU: use a GPU (`gpuwise gpus`), or check the step's cost with `gpuwise estimate`"
    return Finding("compute_bound", evidence, fix, severity="info")
