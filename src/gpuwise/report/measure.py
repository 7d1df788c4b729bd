"""Tables for `gpuwise measure`: one measurement, and a max-batch search."""

from __future__ import annotations

from rich.table import Table

from ..measuring.api import Measurement
from ..measuring.maxbatch import MaxBatchResult
from ..units import fmt_bytes, fmt_duration


def _setting(m: Measurement) -> str:
    ckpt = ", checkpointing" if m.checkpointing else ""
    return f"{m.workload} · batch {m.batch_size} · {m.optimizer or 'workload optimizer'} · {m.precision}{ckpt}"


def measurement_table(m: Measurement) -> Table:
    """What the steps really did: memory at the steady-state peak, device memory, time, throughput."""
    where = m.gpu_name or m.device
    t = Table(title=f"Measured on {where} ({m.device})", caption=_setting(m), title_justify="left",
              caption_justify="left")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_column("how", style="dim")
    t.add_row("peak allocated (steady step)", fmt_bytes(m.peak_allocated_bytes), m.peak_method or "not measured")
    if m.device.startswith("cuda"):
        t.add_row("peak reserved (caching allocator)", fmt_bytes(m.peak_reserved_bytes), "torch.cuda.max_memory_reserved")
        t.add_row("device used by this process", fmt_bytes(m.device_used_bytes), m.device_used_method or "NVML unavailable")
    timer = "CUDA events" if m.device.startswith("cuda") else "perf_counter"
    t.add_row("step time (median)", fmt_duration(m.step_time_s), f"{m.steps} steps after {m.warmup} warm-up, {timer}")
    if m.step_times_s:
        t.add_row("step time (min … max)", f"{fmt_duration(min(m.step_times_s))} … {fmt_duration(max(m.step_times_s))}", "")
    t.add_row("samples/s", f"{m.samples_per_s:,.1f}" if m.samples_per_s else "-", "batch size / median step time")
    if m.snapshot:
        t.add_row("memory snapshot", m.snapshot, "open at https://pytorch.org/memory_viz")
    return t


def oom_message(m: Measurement) -> str:
    return (f"[bold red]out of memory[/bold red]: {_setting(m)} does not fit on {m.device}. "
            f"Try a smaller --batch-size, --precision bf16, --checkpointing, or `--max-batch` to find the largest.")


def maxbatch_table(res: MaxBatchResult, title: str) -> Table:
    t = Table(title=title, title_justify="left")
    t.add_column("#", justify="right")
    t.add_column("batch", justify="right")
    t.add_column("result")
    t.add_column("seconds", justify="right")
    for i, trial in enumerate(res.trials, 1):
        style = {"ok": "green", "oom": "red"}.get(trial.status, "yellow")
        t.add_row(str(i), str(trial.batch_size), f"[{style}]{trial.status}[/{style}]", f"{trial.seconds:.1f}")
    best = "none (even the smallest batch failed)" if res.max_batch_size is None else str(res.max_batch_size)
    t.caption = f"max batch size: {best}" + (" (stopped at --limit)" if res.capped else "")
    if res.error:
        t.caption += f"; stopped: {res.error}"
    return t
