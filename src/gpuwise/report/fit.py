"""Tables and the chart of `gpuwise fit` (a FitResult, or one per GPU for --gpu all)."""

from __future__ import annotations

from rich.table import Table

from ..plan.fit import NO_SPEED
from ..plan.memory.cuda import RETRIES_NOTE
from ..plan.speed.cost import ELECTRICITY_USD_PER_KWH, LIFE_YEARS, PRICES_DATE
from ..units import GIB, fmt_bytes
from . import console


def options_table(result) -> Table:
    n = f"{result.nproc} x " if result.nproc > 1 else ""
    t = Table(title=f"fit: {result.workload} on {n}{result.gpu} ({fmt_bytes(result.gpu_memory_bytes)} each), "
                    f"batch {result.batch_size} per rank", title_justify="left")
    t.add_column("#", justify="right")
    t.add_column("option")
    t.add_column("fits")
    t.add_column("memory/GPU", justify="right")
    t.add_column("samples/s", justify="right")
    t.add_column("eff. batch", justify="right")
    t.add_column("what changes", style="dim", overflow="fold")
    for i, o in enumerate(result.options, 1):
        if not o.sized:  # cannot tell: its trace needs a library, or the tracer cannot run it (its note says)
            t.add_row(str(i), o.name, "[yellow]?[/yellow]", "-", "-", str(o.effective_batch_size), _short_note(o))
            continue
        floor = getattr(o, "floor_only", False)  # not traced: a floor already over the card
        t.add_row(str(i), o.name, "[green]yes[/green]" if o.fits else "[red]no[/red]",
                  ("≥ " if floor else "") + fmt_bytes(o.device_used_bytes) + ("*" if _by_retries(o) else ""),
                  "-" if floor else "?" if NO_SPEED in o.notes else f"{o.samples_per_s:,.1f}",
                  str(o.effective_batch_size), _short_note(o))
    return t


def _by_retries(option) -> bool:
    """It fits only by freeing the allocator's cache (plan/memory/cuda.py `retries_note`)."""
    return any(n.startswith(RETRIES_NOTE) for n in option.notes)


def _short_note(option) -> str:
    """The most specific note (the last change's; why it was not sized, where it was not), cut to one line."""
    notes = [n for n in option.notes if not n.startswith(("numbers from", RETRIES_NOTE))]
    text = notes[0] if not option.sized and notes else notes[-1] if notes else ""
    return text if len(text) <= 70 else text[:69] + "…"


def render_fit(result, top_code: int = 3) -> None:
    console.out.print(options_table(result))
    if any(not o.sized for o in result.options):
        console.out.print("? cannot tell: not sized (its note says why; --json has it whole)")
    if any(_by_retries(o) for o in result.options):
        console.out.print("* fits only as PyTorch's allocator runs a full card: it frees its cache and retries a "
                          "failed cudaMalloc (the option's allocator note in --json; not in samples/s)")
    fitting = result.fitting
    if not fitting:
        console.out.print(f"[red]nothing fits[/red] on {result.nproc} x {result.gpu}: try more GPUs (-n) or "
                          "`--gpu all`")
    for o in fitting[:top_code]:
        console.out.print(f"[bold]{o.name}[/bold]: " + " | ".join(o.changes.get("code", [])) or "(no change)")
    if result.cost is not None:
        c = result.cost
        console.out.print(f"time to train: {_hours(c.seconds)} on {c.nproc} x {result.gpu} ({c.gpu_hours:,.1f} GPU-hours); "
                          f"rent ${c.rent_usd:,.0f}" if c.rent_usd is not None else "rent: no price (--price GPU=USD)")
        if c.own_usd is not None:
            console.out.print(f"own: ${c.own_usd:,.0f} (purchase over its life + power)")
    speed = ("samples/s are the speed model's predictions (plan/speed/), never above the roofline bound"
             if not any(NO_SPEED in o.notes for o in result.options) else
             f"samples/s: cannot tell ({result.gpu}: no FLOP/s or bandwidth; name a catalog GPU for them)")
    console.out.print(f"[dim]{result.traces} traces, {result.seconds:.1f} s; {speed}[/dim]")


def gpus_table(results) -> Table:
    t = Table(title=f"fit: {results[0].workload} on every catalog GPU (x{results[0].nproc}), "
                    f"batch {results[0].batch_size}", title_justify="left")
    t.add_column("GPU")
    t.add_column("memory", justify="right")
    t.add_column("fits")
    t.add_column("best option")
    t.add_column("memory/GPU", justify="right")
    t.add_column("samples/s", justify="right")
    costs = any(r.cost is not None for r in results)
    if costs:
        t.add_column("time", justify="right")
        t.add_column("rent $", justify="right")
        t.add_column("own $", justify="right")
    for r in sorted(results, key=lambda r: -(r.fitting[0].samples_per_s if r.fitting else -1)):
        best = r.fitting[0] if r.fitting else None
        row = [r.gpu, fmt_bytes(r.gpu_memory_bytes), f"{len(r.fitting)}/{len(r.options)}",
               best.name if best else "[red]none[/red]", fmt_bytes(best.device_used_bytes) if best else "",
               f"{best.samples_per_s:,.1f}" if best else ""]
        if costs:
            c = r.cost
            row += [_hours(c.seconds) if c else "", f"{c.rent_usd:,.0f}" if c and c.rent_usd is not None else "-",
                    f"{c.own_usd:,.0f}" if c and c.own_usd is not None else "-"]
        t.add_row(*row)
    if costs:
        t.caption = (f"time at the predicted speed; rent: on-demand $/GPU-hour (defaults dated {PRICES_DATE}, "
                     f"--price GPU=USD); own: purchase over {LIFE_YEARS:g} years + board power at "
                     f"${ELECTRICITY_USD_PER_KWH}/kWh (--buy GPU=USD); '-': no price known")
    return t


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h" if seconds >= 3600 else f"{seconds / 60:,.1f} min"


def plot_fit(result, path: str) -> str:
    """Horizontal bars: each option's memory per GPU against the GPU's memory, and its samples/s."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    opts = list(reversed(result.options))
    names = [o.name for o in opts]
    height = max(3.0, 0.32 * len(opts) + 1.2)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, height), sharey=True, gridspec_kw={"width_ratios": [3, 2]})
    colors = ["tab:green" if o.fits else "tab:red" for o in opts]
    ax1.barh(names, [o.device_used_bytes / GIB for o in opts], color=colors)
    ax1.axvline(result.gpu_memory_bytes / GIB, color="black", linestyle="--", label=f"{result.gpu} memory")
    ax1.set_xlabel("device memory per GPU (GiB, nvidia-smi)")
    ax1.legend(loc="lower right", fontsize=8)
    ax2.barh(names, [o.samples_per_s for o in opts], color=colors)
    ax2.set_xlabel("samples/s (upper bound)")
    n = f"{result.nproc} x " if result.nproc > 1 else ""
    fig.suptitle(f"gpuwise fit: {result.workload} on {n}{result.gpu} — green fits, red does not", fontsize=10)
    ax1.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
