"""A self-contained HTML report of a monitored run: summary, findings, timeline charts (inline PNG).

Charts are drawn with matplotlib's Agg backend (no display needed) and embedded as base64, so the
file can be mailed or attached to an issue. Every string that came from the user or the run (command
line, device names, notes, findings) goes through `html.escape`.
"""

from __future__ import annotations

import base64
import html
import io
import os
import time

from ..units import GIB, fmt_bytes, fmt_duration

MAX_BARS = 300  # more steps than this are averaged into bins so the bars stay readable


def _figure(timeline):
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(10, 8.5), constrained_layout=True)
    _plot_utilization(axes[0], timeline)
    _plot_memory(axes[1], timeline)
    _plot_steps(axes[2], timeline)
    return fig, plt


def charts_png(timeline) -> bytes:
    """The three timeline charts (utilisation, memory, step-time split) as one PNG."""
    fig, plt = _figure(timeline)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def _plot_utilization(ax, tl) -> None:
    indices = sorted({i for s in tl.samples for i in s.gpus})
    for i in indices:
        pts = [(s.t_s, s.gpus[i].get("utilization_pct")) for s in tl.samples if i in s.gpus]
        pts = [(a, b) for a, b in pts if b is not None]
        if pts:
            ax.plot([a for a, _ in pts], [b for _, b in pts], label=f"GPU {i} utilisation", lw=1.2)
    cpu = [(s.t_s, s.cpu_pct) for s in tl.samples if s.cpu_pct is not None]  # host samples are sparser
    if cpu:
        ax.plot([a for a, _ in cpu], [b for _, b in cpu], label="CPU (machine)", lw=1, alpha=0.7)
    cores = tl.meta.get("cpu_count") or os.cpu_count() or 1
    proc = [(s.t_s, s.proc_cpu_pct / cores) for s in tl.samples if s.proc_cpu_pct is not None]
    if proc:
        ax.plot([a for a, _ in proc], [b for _, b in proc], label="CPU (the job, % of all cores)", lw=1, alpha=0.8)
    ax.set_ylim(-2, 102)
    ax.set_ylabel("%")
    ax.set_title("Utilisation" + ("" if indices else " (no GPU sampled: CPU only)"))
    ax.set_xlabel("time (s)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper right", fontsize=8)


def _plot_memory(ax, tl) -> None:
    for i in sorted({i for s in tl.samples for i in s.gpus}):
        pts = [(s.t_s, s.gpus[i].get("memory_used_bytes")) for s in tl.samples if i in s.gpus]
        pts = [(a, b) for a, b in pts if b is not None]
        if pts:
            ax.plot([a for a, _ in pts], [b / GIB for _, b in pts], label=f"GPU {i} used (NVML)")
    alloc = [(s.start_s + s.total_s, s.memory_allocated_bytes) for s in tl.steps if s.memory_allocated_bytes is not None]
    if alloc:
        ax.plot([a for a, _ in alloc], [b / GIB for _, b in alloc], label="allocated by torch", lw=1)
    rss = [(s.t_s, s.rss_bytes) for s in tl.samples if s.rss_bytes is not None]
    if rss:
        ax.plot([a for a, _ in rss], [b / GIB for _, b in rss], label="process RSS (host)", lw=1, alpha=0.8)
    ax.set_ylabel("GiB")
    ax.set_xlabel("time (s)")
    ax.set_title("Memory")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper right", fontsize=8)


def _plot_steps(ax, tl) -> None:
    ranks = tl.ranks
    steps = [s for s in tl.steps if s.rank == ranks[0]] if ranks else []
    if not steps:
        ax.text(0.5, 0.5, "no per-step timing (the script does not use gpuwise.monitor)", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_axis_off()
        return
    size = max(1, -(-len(steps) // MAX_BARS))
    bins = [steps[i:i + size] for i in range(0, len(steps), size)]
    x = [b[0].step for b in bins]
    parts = {"data wait": [1e3 * sum(s.data_s for s in b) / len(b) for b in bins],
             "copy": [1e3 * sum(s.copy_s for s in b) / len(b) for b in bins],
             "compute": [1e3 * sum(s.compute_s for s in b) / len(b) for b in bins]}
    bottom = [0.0] * len(bins)
    colors = {"data wait": "#d62728", "copy": "#ff7f0e", "compute": "#2ca02c"}
    for name, vals in parts.items():
        ax.bar(x, vals, bottom=bottom, width=size * 0.9, label=name, color=colors[name], align="edge")
        bottom = [a + b for a, b in zip(bottom, vals)]
    ax.set_ylabel("ms per step")
    ax.set_xlabel("step" + (f" (mean of {size} steps per bar)" if size > 1 else ""))
    ax.set_title("Step-time split" + (f" (rank {ranks[0]} of {len(ranks)})" if len(ranks) > 1 else ""))
    ax.legend(loc="upper right", fontsize=8)


_CSS = """body{font-family:system-ui,sans-serif;max-width:980px;margin:2em auto;color:#222}
table{border-collapse:collapse}td,th{padding:3px 10px;border-bottom:1px solid #ddd;text-align:left}
.finding{border-left:4px solid #d62728;padding:4px 12px;margin:8px 0;background:#fff5f5}
.info{border-color:#1f77b4;background:#f3f8fd}code{background:#f2f2f2;padding:1px 4px}.muted{color:#777}"""


def _fmt(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def _rows(summary: dict) -> list[tuple[str, str]]:
    pct = lambda x: "—" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    util = summary.get("utilization") or {}
    mem = summary.get("memory") or {}
    host = summary.get("host") or {}
    rows = [("device", f"{summary.get('device')} ({summary.get('device_name') or '?'})"),
            ("steps", _fmt(summary.get("steps"))),
            ("median step", fmt_duration((summary.get("step_time_s") or {}).get("median"))),
            ("data wait", pct(summary.get("data_wait_fraction"))), ("copy", pct(summary.get("copy_fraction"))),
            ("compute", pct(summary.get("compute_fraction"))), ("batch size", _fmt(summary.get("batch_size"))),
            ("precision", _fmt(summary.get("precision")))]
    if util.get("samples"):
        rows.append(("GPU utilisation", f"mean {util['mean_pct']:.0f}%, idle (≤10%) {pct(util['low_fraction'])}, "
                                        f"busy (≥90%) {pct(util['high_fraction'])} of {util['samples']} samples"))
    if mem.get("use_fraction") is not None:
        rows.append(("GPU memory peak", f"{pct(mem['use_fraction'])} of {fmt_bytes(mem.get('device_total_bytes'))}"))
    if host.get("process_cpu_mean_pct") is not None:
        rows.append(("process CPU", f"{host['process_cpu_mean_pct']:.0f}% (100% = one core of {host.get('cpu_count')})"))
    if host.get("rss_peak_bytes"):
        rows.append(("process RSS peak", fmt_bytes(host["rss_peak_bytes"])))
    if summary.get("exit_code") is not None:
        rows.append(("exit code", _fmt(summary["exit_code"])))
    return rows


def render_html(timeline, summary: dict, title: str = "gpuwise watch report") -> str:
    """The report as one HTML string (charts inline)."""
    e = html.escape
    png = base64.b64encode(charts_png(timeline)).decode()
    command = summary.get("command") or timeline.meta.get("command")
    cmd_text = " ".join(command) if isinstance(command, list) else command
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{_CSS}</style></head><body>",
             f"<h1>{e(title)}</h1>",
             f"<p class='muted'>{e(time.strftime('%Y-%m-%d %H:%M:%S'))}"
             + (f" · command: <code>{e(cmd_text)}</code>" if cmd_text else "") + "</p>",
             "<h2>Findings</h2>"]
    findings = summary.get("findings") or []
    unknown = summary.get("cannot_tell") or []
    for why in unknown:
        parts.append(f"<p><b>Cannot tell.</b> {html.escape(why)}</p>")
    if not findings and not unknown:
        parts.append("<p>No problem found.</p>")
    for f in findings:
        cls = "finding info" if f.get("severity") == "info" else "finding"
        parts.append(f"<div class='{cls}'><b>{e(str(f.get('kind')))}</b><br>{e(str(f.get('evidence')))}"
                     f"<br><i>fix:</i> {e(str(f.get('fix')))}</div>")
    parts.append("<h2>Summary</h2><table>")
    parts += [f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in _rows(summary)]
    parts.append("</table>")
    if summary.get("ranks"):
        parts.append("<h2>Ranks</h2><table><tr><th>rank</th><th>steps</th><th>median step</th><th>data wait</th></tr>")
        for r in summary["ranks"]:
            parts.append(f"<tr><td>{e(_fmt(r['rank']))}</td><td>{e(_fmt(r['steps']))}</td>"
                         f"<td>{e(fmt_duration(r['step_time_s_median']))}</td><td>{e(_fmt(r['data_wait_fraction']))}</td></tr>")
        parts.append("</table>")
    parts.append(f"<h2>Timeline</h2><img alt='utilisation, memory and step-time charts' style='max-width:100%' "
                 f"src='data:image/png;base64,{png}'>")
    if summary.get("notes"):
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{e(str(n))}</li>" for n in summary["notes"]) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html(path: str, timeline, summary: dict, title: str = "gpuwise watch report") -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)  # runs/today/report.html at the end of a run
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(render_html(timeline, summary, title))
    return path
