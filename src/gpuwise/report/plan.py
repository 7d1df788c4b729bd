"""Tables and charts of an `Estimate` (the plan's result). Only this module draws it."""

from __future__ import annotations

from rich.table import Table

from ..units import GIB, fmt_bytes, fmt_count, fmt_duration
from . import console

CATEGORY_LABELS = {
    "parameters": "parameters", "gradients": "gradients", "optimizer_state": "optimizer state",
    "activations": "activations (saved)", "temporary": "temporaries", "buffers": "buffers", "inputs": "inputs",
}


def summary_table(est) -> Table:
    t = Table(title=f"estimate: {est.workload}  batch {est.batch_size}  {est.target}  {est.optimizer}  "
                    f"{est.precision}{'  checkpointing' if est.checkpointing else ''}", title_justify="left")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_column("note", style="dim")
    if est.target == "cuda":
        t.add_row("peak allocated", fmt_bytes(est.peak_allocated_bytes), "torch.cuda.max_memory_allocated()")
        t.add_row("peak reserved", fmt_bytes(est.peak_reserved_bytes),
                  f"caching allocator, {est.allocator.segments} segments, "
                  f"{100 * est.allocator.fragmentation:.1f}% cached free" if est.allocator else "")
        o = est.overheads
        t.add_row("device used", fmt_bytes(est.device_used_bytes),
                  f"nvidia-smi: + context {fmt_bytes(o.context_bytes)}"
                  + (f" + cuDNN {fmt_bytes(o.cudnn_bytes)}" if o.cudnn_bytes else "")
                  + (f" + NCCL {fmt_bytes(o.nccl_bytes)}" if o.nccl_bytes else "") + f" ({o.arch})")
        if o.workspaces:
            t.add_row("  of which workspaces", fmt_bytes(o.workspace_bytes), ", ".join(n for n, _ in o.workspaces))
    else:
        t.add_row("peak memory", fmt_bytes(est.peak_allocated_bytes), "CPU tensors at the steady-state peak")
    where = " · ".join(x for x in (est.peak_phase, est.peak_op, est.peak_module) if x)
    t.add_row("peak at", "", where)
    t.add_row("FLOPs per step", fmt_count(est.flops_per_step, "FLOP"), "torch.utils.flop_counter formulas")
    if est.gpu:
        limit = est.capacity.limit_bytes if est.capacity else None
        verdict = "[green]fits[/green]" if est.fits else "[red]does not fit[/red]"
        t.add_row(f"on {est.gpu}", verdict, f"{fmt_bytes(est.gpu_memory_bytes)} total"
                  + (f", {fmt_bytes(limit)} usable ({est.capacity.margin_pct:g}% margin)" if limit else ""))
        if est.capacity is not None:
            c = est.capacity
            how = (f"{c.max_batch_size} fits, {c.max_batch_size + 1} does not" if c.settled and not c.capped
                   else "the search's ceiling" if c.capped else f"lower bound: trace budget ({c.max_traces}) spent")
            t.add_row("largest batch", str(c.max_batch_size),
                      f"traced {c.traces} sizes ({how}); peak in {c.peak_phase or '?'}: "
                      f"{fmt_bytes(c.fit.fixed_bytes)} + {fmt_bytes(c.fit.per_sample_bytes)}/sample"
                      + (f"; first prediction {c.predicted_max_batch_size} ({c.prediction_error_pct:+.1f}%)"
                         if c.prediction_error_pct is not None else ""))
        if est.roofline is not None:
            r = est.roofline
            t.add_row("roofline step time", fmt_duration(r.time_s),
                      f"{r.bound}-bound: {fmt_count(r.peak_flops, 'FLOP/s')} peak, "
                      f"{fmt_bytes(r.bytes_per_step)} moved at {fmt_count(r.bandwidth_bytes_per_s, 'B/s')}")
            t.add_row("samples/s bound", f"{r.samples_per_s:,.0f}", "upper bound at 100% of datasheet peak")
        if est.speed is not None:
            sp = est.speed
            parts = ", ".join(f"{k.replace('_', ' ')} {fmt_duration(v)}" for k, v in sp.breakdown.items() if v > 0)
            t.add_row("predicted step time", fmt_duration(sp.step_time_s),
                      f"{sp.bound_by.replace('_', ' ')}-bound; MFU {100 * sp.mfu:.0f}%; {parts}"
                      + (f"; {sp.strategy} x{sp.nproc}" if sp.nproc > 1 else ""))
            rate = (f"{sp.tokens_per_s_per_gpu:,.0f} tokens/s/GPU" if sp.tokens_per_s_per_gpu
                    else f"{sp.samples_per_s / max(sp.nproc, 1):,.1f} samples/s/GPU")
            t.add_row("predicted samples/s", f"{sp.samples_per_s:,.1f}", rate)
    t.add_row("method", est.method, f"{est.seconds:.1f} s")
    return t


def category_table(est) -> Table:
    t = Table(title="live at the peak", title_justify="left")
    t.add_column("category")
    t.add_column("bytes", justify="right")
    t.add_column("share", justify="right")
    total = sum(est.by_category.values()) or 1
    for cat, label in CATEGORY_LABELS.items():
        n = est.by_category.get(cat, 0)
        t.add_row(label, fmt_bytes(n), f"{100 * n / total:.1f}%")
    return t


def module_table(est) -> Table:
    t = Table(title="top modules at the peak", title_justify="left")
    t.add_column("module")
    t.add_column("bytes", justify="right")
    for name, n in est.by_module.items():
        t.add_row(name or "(outside modules)", fmt_bytes(n))
    return t


def render_estimate(est) -> None:
    console.out.print(summary_table(est))
    console.out.print(category_table(est))
    if est.by_module:
        console.out.print(module_table(est))
    for note in est.notes:
        console.out.print(f"[dim]note: {note}[/dim]")


def plot_estimate(est, path: str) -> str:
    """A PNG/SVG/PDF (by extension): the breakdown at the peak, and memory vs batch size with the GPU line."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    has_curve = est.capacity is not None and est.capacity.points
    fig, axes = plt.subplots(1, 2 if has_curve else 1, figsize=(11 if has_curve else 6, 4.2), squeeze=False)
    ax = axes[0][0]
    bottom = 0.0
    for cat, label in CATEGORY_LABELS.items():
        n = est.by_category.get(cat, 0) / GIB
        if n > 0:
            ax.bar([0], [n], bottom=bottom, label=label)
            bottom += n
    bars = [("tensors", bottom)]
    if est.target == "cuda":
        bars += [("reserved", est.peak_reserved_bytes / GIB), ("device used", est.device_used_bytes / GIB)]
        for i, (_, v) in enumerate(bars[1:], start=1):
            ax.bar([i], [v], color="0.6" if i == 1 else "0.35")
    ax.set_xticks(range(len(bars)), [b for b, _ in bars])
    ax.set_ylabel("GiB")
    ax.set_title(f"{est.workload} batch {est.batch_size} ({est.precision})")
    ax.legend(fontsize=7, loc="upper left")
    if has_curve:
        ax2 = axes[0][1]
        pts = sorted(est.capacity.points, key=lambda p: p.batch_size)
        xs = [p.batch_size for p in pts]
        ax2.plot(xs, [p.device_used_bytes / GIB for p in pts], "o-", label="device used (traced)")
        ax2.plot(xs, [p.peak_allocated_bytes / GIB for p in pts], "s--", label="peak allocated (traced)")
        fit = est.capacity.fit
        ax2.plot([0, max(xs)], [fit.at(0) / GIB, fit.at(max(xs)) / GIB], ":", color="0.4", label="fitted line")
        ax2.axhline(est.gpu_memory_bytes / GIB, color="red", label=f"{est.gpu} memory")
        ax2.axhline(est.capacity.limit_bytes / GIB, color="red", ls="--", lw=0.8,
                    label=f"limit ({est.capacity.margin_pct:g}% margin)")
        ax2.axvline(est.capacity.max_batch_size, color="green", ls=":", label=f"largest batch {est.capacity.max_batch_size}")
        ax2.set_xlabel("batch size")
        ax2.set_ylabel("GiB")
        ax2.set_title("memory vs batch size")
        ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
