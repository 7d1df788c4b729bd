"""Terminal rendering of a monitor summary: the step-time split, utilisation, then the findings."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from ..units import fmt_bytes, fmt_duration
from .console import out


def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:.0f}%"


def render_summary(summary: dict, console=None, report_path: str | None = None) -> None:
    """Print the summary table and the findings (evidence and fix) to `console` (stdout by default)."""
    console = console or out
    t = Table(title="gpuwise watch", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    t.add_row("device", f"{summary.get('device')} ({summary.get('device_name') or '?'})")
    steps = summary.get("steps") or 0
    median = (summary.get("step_time_s") or {}).get("median")
    t.add_row("steps", f"{steps}" + (f", median {fmt_duration(median)}" if median else ""))
    if summary.get("data_wait_fraction") is not None:
        t.add_row("step split", f"[red]data wait {_pct(summary['data_wait_fraction'])}[/red]  "
                                f"[yellow]copy {_pct(summary['copy_fraction'])}[/yellow]  "
                                f"[green]compute {_pct(summary['compute_fraction'])}[/green]")
    else:
        t.add_row("step split", "[yellow]cannot tell (see below)[/yellow]")
    util = summary.get("utilization") or {}
    if util.get("samples"):
        t.add_row("GPU utilisation", f"mean {util['mean_pct']:.0f}%, idle {_pct(util['low_fraction'])} / "
                                     f"busy {_pct(util['high_fraction'])} of {util['samples']} samples")
    mem = summary.get("memory") or {}
    if mem.get("use_fraction") is not None:
        t.add_row("GPU memory", f"peak {_pct(mem['use_fraction'])} of {fmt_bytes(mem.get('device_total_bytes'))}")
    for label, text in health_rows(summary.get("gpu_health") or {}):
        t.add_row(label, text)
    host = summary.get("host") or {}
    if host.get("process_cpu_mean_pct") is not None:
        machine = f", machine {host['cpu_mean_pct']:.0f}%" if host.get("cpu_mean_pct") is not None else ""
        t.add_row("CPU", f"process {host['process_cpu_mean_pct']:.0f}% (100% = 1 core){machine} of "
                         f"{host.get('cpu_count')} cores, RSS peak {fmt_bytes(host.get('rss_peak_bytes'))}")
    if summary.get("exit_code") is not None:
        t.add_row("exit code", str(summary["exit_code"]))
    console.print(t)
    for r in summary.get("ranks") or []:
        console.print(f"  rank {r['rank']}: {r['steps']} steps, median {fmt_duration(r['step_time_s_median'])}, "
                      f"data wait {_pct(r['data_wait_fraction'])}", markup=False)
    findings = summary.get("findings") or []
    unknown = summary.get("cannot_tell") or []
    for why in unknown:
        console.print(Text(why, style="bold yellow"))
    if not findings and not unknown:
        console.print("[green]no problem found[/green]")
    for f in findings:
        colour = "blue" if f.get("severity") == "info" else "red"
        console.print(f"[bold {colour}]{f['kind']}[/bold {colour}]: ", end="")
        console.print(f["evidence"], markup=False)
        console.print("  [bold]fix:[/bold] ", end="")
        console.print(f["fix"], markup=False)
    for note in summary.get("notes") or []:
        if note in unknown:
            continue
        console.print(Text(f"note: {note}", style="dim"))  # Text: brackets in a note are not markup
    if report_path:
        console.print(f"[dim]report: {report_path}[/dim]")


def health_rows(h: dict) -> list[tuple[str, str]]:
    """The clock and PCIe-link rows of the watch table (monitoring/health.py's `gpu_health`)."""
    rows = []
    if h.get("clock_samples"):
        clock = f"SM median {h['sm_clock_median_mhz']:.0f}" if h.get("sm_clock_median_mhz") else "SM ?"
        clock += f" of {h['sm_clock_max_mhz']:.0f} MHz" if h.get("sm_clock_max_mhz") else " MHz"
        held = f"held by heat {_pct(h['thermal_fraction'])}, power {_pct(h['power_fraction'])}, " \
               f"hardware {_pct(h['hw_slowdown_fraction'])} of {h['clock_samples']} samples"
        hot = f"; hottest {h['temperature_max_c']:.0f} °C" if h.get("temperature_max_c") is not None else ""
        rows.append(("GPU clocks", f"{clock}; {held}{hot}"))
    if h.get("pcie_gen"):
        link = f"gen{h['pcie_gen']} x{h['pcie_width']}"
        if h.get("pcie_bandwidth_bytes_per_s"):
            link += f" ({h['pcie_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s)"
        if h.get("pcie_gen_max") and (h["pcie_gen_max"], h.get("pcie_width_max")) != (h["pcie_gen"], h["pcie_width"]):
            link += f", max gen{h['pcie_gen_max']} x{h.get('pcie_width_max')}"
        if h.get("pcie_rx_mean_bytes_per_s") is not None:
            link += f"; host->device mean {h['pcie_rx_mean_bytes_per_s'] / 1e9:.2f} GB/s"
        rows.append(("PCIe link", link))
    return rows
