"""Tables of `gpuwise doctor`: the checks, and the cuda:k -> nvidia-smi GPU mapping."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from ..doctor.model import OK, PROBLEM, SKIPPED, WARNING, Check

MARK = {OK: "[green]ok[/green]", WARNING: "[yellow]warning[/yellow]", PROBLEM: "[bold red]problem[/bold red]",
        SKIPPED: "[dim]skipped[/dim]"}


def checks_table(checks: list[Check]) -> Table:
    """One row per check that ran, with a fix marker; the fixes follow as whole lines (`fix_lines`), so
    that commands and URLs are never wrapped; the skipped checks are one line (`skipped_line`)."""
    t = Table(title="gpuwise doctor", title_justify="left")
    t.add_column("check", no_wrap=True)
    t.add_column("status", no_wrap=True)
    t.add_column("evidence", overflow="fold")
    for c in checks:
        if c.status != SKIPPED:
            t.add_row(c.name, MARK[c.status], escape(c.evidence) + (" [dim](fix below)[/dim]" if c.fix else ""))
    return t


def fix_lines(checks: list[Check]) -> list[str]:
    """Problems and warnings with their fix; `hint` for advice attached to an ok check."""
    return [f"{MARK[c.status] if c.status != OK else '[dim]hint[/dim]'} {c.name}: {escape(c.fix)}"
            for c in checks if c.fix and c.status != SKIPPED]


def skipped_line(checks: list[Check]) -> str | None:
    skipped = [c for c in checks if c.status == SKIPPED]
    if not skipped:
        return None
    by_reason: dict[str, list[str]] = {}
    for c in skipped:
        by_reason.setdefault(c.evidence, []).append(c.name)
    return "skipped: " + "; ".join(f"{', '.join(names)} ({escape(reason)})" for reason, names in by_reason.items())


def mapping_table(check: Check) -> Table | None:
    rows = check.details.get("mapping")
    if not rows:
        return None
    t = Table(title="Which GPU is cuda:k (nvidia-smi numbering)", title_justify="left")
    fastest = "with the default FASTEST_FIRST " + ("(measured in PyTorch)" if check.details.get("measured") else "(guess)")
    for col in ("torch device", "CUDA_VISIBLE_DEVICES entry", "with CUDA_DEVICE_ORDER=PCI_BUS_ID", fastest):
        t.add_column(col)

    def gpu(d):
        return "-" if d is None else f"GPU {d['index']} {d['name'].removeprefix('NVIDIA ')}" + \
            (f" [{d['pci_bus_id']}]" if d.get("pci_bus_id") else "")
    for r in rows:
        t.add_row(f"cuda:{r['cuda_index']}", r["token"], gpu(r["with_pci_bus_id"]), gpu(r["with_fastest_first"]))
    t.caption = ("FASTEST_FIRST: CUDA puts the GPU its heuristic finds fastest first and leaves the rest unspecified; "
                 "gpuwise assumes higher compute capability first, PCI order among equals")
    return t
