"""Tables of devices."""

from __future__ import annotations

from rich.table import Table

from ..devices.model import Gpu, HostDevice
from ..units import fmt_bytes


def gpu_table(gpus: list[Gpu], best_index: int | None, reserved: set[str], show_processes: bool = False,
              show_uuid: bool = False) -> Table:
    t = Table(title="GPUs", title_justify="left")
    cols = [("", "left"), ("#", "right"), ("name", "left"), ("used / total", "right"), ("free", "right"),
            ("util", "right"), ("temp", "right"), ("power", "right"), ("procs", "right")]
    if show_uuid:
        cols.append(("uuid", "left"))
    for col, justify in cols:
        t.add_column(col, justify=justify, no_wrap=True)
    for g in gpus:
        mark = "★" if g.index == best_index else ("R" if g.uuid in reserved else "")
        row = [mark, str(g.index), g.name.removeprefix("NVIDIA "),
               f"{fmt_bytes(g.memory_used_bytes)} / {fmt_bytes(g.memory_total_bytes)}",
               fmt_bytes(g.memory_free_bytes), _opt(g.utilization_pct, "%"), _opt(g.temperature_c, "°C"),
               _opt(g.power_w, " W"), str(len(g.processes))]
        t.add_row(*row, *([g.uuid] if show_uuid else []))
        if show_processes:
            for p in g.processes:
                t.add_row("", "", f"  pid {p.pid} {p.user or '?'} {p.name or ''}", fmt_bytes(p.used_bytes),
                          *[""] * (len(cols) - 4))
    if reserved:
        t.caption = "R = reserved by another gpuwise job"
    return t


def host_table(hosts: list[HostDevice]) -> Table:
    t = Table(title="Host devices", title_justify="left")
    for col in ("device", "name", "cores", "memory total", "available"):
        t.add_column(col)
    for h in hosts:
        t.add_row(h.kind, h.name, str(h.cores or "-"), fmt_bytes(h.memory_total_bytes), fmt_bytes(h.memory_available_bytes))
    return t


def _opt(value, unit: str) -> str:
    return "-" if value is None else f"{value:.0f}{unit}"
