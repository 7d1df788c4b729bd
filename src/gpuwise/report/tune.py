"""Rendering a `TuneResult`: the ready-to-paste snippet, the tables, the charts and the progress bar."""

from __future__ import annotations

import os
from typing import Any

from rich.table import Table

from ..tuning.records import Trial
from ..units import fmt_bytes, fmt_duration
from .console import progress


def snippet(result) -> str:
    """The answer as code: DataLoader arguments, the batch size, autocast/GradScaler for the precision."""
    b = result.best
    lines = [f"# gpuwise tune {result.workload} on {result.device}: {_rate(b.samples_per_s)} samples/s"
             + (f" (x{result.speedup:.2f} the defaults)" if result.speedup else "")]
    args = [f"batch_size={b.batch_size}", "shuffle=True", f"num_workers={b.num_workers}",
            f"pin_memory={b.pin_memory}"]
    if b.num_workers:
        args.append(f"persistent_workers={b.persistent_workers}")
        if b.prefetch_factor is not None:
            args.append(f"prefetch_factor={b.prefetch_factor}")
    lines.append(f"loader = torch.utils.data.DataLoader(dataset, {', '.join(args)})")
    if b.num_threads and b.num_workers:
        lines.append(f"torch.set_num_threads({b.num_threads})  # leave the DataLoader workers their CPU cores")
    nb = "non_blocking=True" if b.pin_memory else ""
    dev = "cuda" if result.device.startswith("cuda") else result.device
    prec = b.precision
    if prec == "tf32":
        lines.append("torch.backends.cuda.matmul.allow_tf32 = True; torch.backends.cudnn.allow_tf32 = True")
    if prec == "fp16":
        lines.append(f"scaler = torch.amp.GradScaler('{dev}')")
    lines.append("for x, y in loader:")
    lines.append(f"    x, y = x.to(device{', ' + nb if nb else ''}), y.to(device{', ' + nb if nb else ''})")
    if prec in ("bf16", "fp16"):
        dt = "bfloat16" if prec == "bf16" else "float16"
        lines.append(f"    with torch.autocast('{dev}', dtype=torch.{dt}):")
        lines.append("        loss = loss_fn(model(x), y)")
    else:
        lines.append("    loss = loss_fn(model(x), y)")
    if prec == "fp16":
        lines += ["    scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()"]
    else:
        lines += ["    loss.backward(); optimizer.step()"]
    lines.append("    optimizer.zero_grad(set_to_none=True)")
    if result.lr_note:
        lines.append(f"# {result.lr_note}")
    return "\n".join(lines)


def _rate(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def summary_table(result) -> Table:
    t = Table(title=f"gpuwise tune {result.workload} ({result.device})", title_justify="left")
    for col in ("", "batch", "workers", "pin", "prefetch", "persistent", "precision", "samples/s"):
        t.add_column(col, justify="right" if col in ("batch", "workers", "samples/s") else "left")
    for name, d in (("defaults", result.baseline), ("tuned", result.best)):
        t.add_row(name, str(d.batch_size), str(d.num_workers), str(d.pin_memory),
                  str(d.prefetch_factor), str(d.persistent_workers), str(d.precision),
                  _rate(d.samples_per_s))
    # the limit is measured at the throughput-optimal batch (the start when the search found none), which
    # the end-to-end answer may differ from (halved by the refinement, or the budget ran out)
    limit_batch = result.throughput_batch_size or result.baseline.batch_size
    t.add_row("compute only", str(limit_batch), "-", "-", "-", "-",
              str(result.best.precision), _rate(result.limit_samples_per_s))
    return t


def precision_table(result) -> Table:
    t = Table(title="precision (compute only, starting batch)", title_justify="left")
    for col in ("precision", "samples/s", "peak memory", "note"):
        t.add_column(col)
    order = ["fp32", "tf32", "bf16", "fp16", "bf16-pure"]
    for p, d in sorted(result.precisions.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99):
        mem = d.get("peak_memory_bytes")
        kind = " (host RSS)" if d.get("memory_kind") == "host_rss" else ""
        t.add_row(p, _rate(d.get("samples_per_s")), (fmt_bytes(mem) + kind) if mem else "-",
                  d.get("skipped") or d.get("status", ""))
    return t


def trials_table(result) -> Table:
    t = Table(title=f"{len(result.trials)} trials", title_justify="left")
    for col in ("kind", "batch", "precision", "workers", "pin", "prefetch", "persist", "samples/s", "status", "time"):
        t.add_column(col)
    for r in result.trials:
        status = r.status + (" (resumed)" if r.resumed else "")
        t.add_row(r.kind, str(r.batch_size), str(r.precision or "-"), _opt(r.num_workers),
                  _opt(r.pin_memory), _opt(r.prefetch_factor), _opt(r.persistent_workers),
                  _rate(r.samples_per_s), status, fmt_duration(r.seconds or 0))
    return t


def _opt(v: Any) -> str:
    return "-" if v is None else str(v)


def _panels(result) -> list[tuple[str, object]]:
    """(file name, draw(ax)) for each chart there is data for: samples/s vs batch size (compute-only
    trials) and vs num_workers (end-to-end trials)."""
    panels = []
    prec = result.best.precision
    pts = sorted((r.batch_size, r.samples_per_s) for r in result.trials
                 if r.kind == "compute" and r.ok and r.precision == prec)
    pts = list(dict(pts).items())
    if pts:
        def by_batch(ax, pts=pts):
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"compute only ({prec})")
            ax.set_xscale("log", base=2)
            ax.set_xticks([p[0] for p in pts], [str(p[0]) for p in pts])
            ax.set_xlabel("batch size")
            ax.set_ylabel("samples/s")
            if result.largest_safe_batch_size:
                ax.axvline(result.largest_safe_batch_size, color="red", ls="--", label="largest safe batch")
            ax.axvline(result.best.batch_size, color="green", ls=":", label="chosen")
            ax.set_title(f"{result.workload}: samples/s vs batch size")
            ax.legend()
        panels.append(("samples_per_s_vs_batch_size.png", by_batch))
    b = result.best.batch_size
    pts = sorted((r.num_workers, r.samples_per_s) for r in result.trials
                 if r.kind == "train" and r.ok and r.batch_size == b
                 and not r.persistent_workers and r.prefetch_factor is None)
    pts = list(dict(pts).items())
    if pts:
        def by_workers(ax, pts=pts):
            from matplotlib.ticker import MaxNLocator

            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"end to end, batch {b}")
            if result.limit_samples_per_s:
                ax.axhline(result.limit_samples_per_s, color="gray", ls="--", label="compute-only limit")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlabel("num_workers")
            ax.set_ylabel("samples/s")
            ax.set_title(f"{result.workload}: samples/s vs DataLoader workers")
            ax.legend()
        panels.append(("samples_per_s_vs_num_workers.png", by_workers))
    return panels


def plot(result, folder: str) -> list[str]:
    """The charts (see `_panels`) as PNGs in `folder` (the older `--plot DIR` form)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(folder, exist_ok=True)
    paths = []
    for name, draw in _panels(result):
        fig, ax = plt.subplots(figsize=(6, 4))
        draw(ax)
        paths.append(_save(fig, folder, name))
    return paths


def plot_file(result, path: str) -> list[str]:
    """The charts (see `_panels`) side by side in one figure at `path` (`--plot FILE`, as in estimate and
    fit; the extension picks the format); [] when no trial gave a chart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = _panels(result)
    if not panels:
        return []
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for (_, draw), ax in zip(panels, axes[0]):
        draw(ax)
    return [_save(fig, os.path.dirname(path) or ".", os.path.basename(path))]


def _save(fig, folder: str, name: str) -> str:
    import matplotlib.pyplot as plt

    path = os.path.join(folder, name)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


class TuneProgress:
    """A progress bar on stderr: trials done, and the budget spent."""

    def __init__(self, budget_s: float, enabled: bool = True):
        self.budget_s = budget_s
        self.bar = progress() if enabled else None

    def __enter__(self):
        if self.bar is not None:
            self.bar.__enter__()
            self.trials = self.bar.add_task("trials", total=None)
            self.budget = self.bar.add_task(f"budget {fmt_duration(self.budget_s)}", total=self.budget_s)
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def __call__(self, record: Trial, elapsed_s: float) -> None:
        if self.bar is None:
            return
        what = f"{record.kind} b={record.batch_size}"
        if record.num_workers is not None:
            what += f" w={record.num_workers}"
        self.bar.update(self.trials, advance=1, description=f"trials (last: {what} {_rate(record.samples_per_s)}/s)")
        self.bar.update(self.budget, completed=min(elapsed_s, self.budget_s))
