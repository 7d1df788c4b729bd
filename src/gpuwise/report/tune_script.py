"""Terminal output of `gpuwise tune -- CMD`: one progress line per trial (stderr), then the table,
the best settings, the code change and the advice on batch size and precision."""

from __future__ import annotations

from rich.table import Table

from ..units import fmt_duration
from .console import err, out


def _settings(overrides: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in overrides.items()) or "as the script is"


def _rate(trial) -> str:
    """samples/s with its 95% band, e.g. `41.2 ±3.1`."""
    if not trial.samples_per_s:
        return trial.status
    low, high = trial.samples_per_s_low, trial.samples_per_s_high
    spread = f" ±{(high - low) / 2:,.1f}" if low is not None and high is not None and high != float("inf") else ""
    return f"{trial.samples_per_s:,.1f}{spread}"


def print_progress(trial, elapsed_s: float) -> None:
    rate = f"{_rate(trial)} samples/s" if trial.samples_per_s else trial.status
    if trial.repeat:
        rate += f" (re-measured, {trial.repeat})"
    why = f" ({trial.error})" if trial.error else ""
    resumed = " (from the results file)" if trial.resumed else ""
    err.print(f"[{elapsed_s:5.0f}s] {_settings(trial.overrides)}: {rate}{why}{resumed}", markup=False)


def render(result, change: str, budget_s: float, results_path: str | None) -> None:
    t = Table(title=f"gpuwise tune -- {' '.join(result.command)}", title_justify="left")
    for col in ("DataLoader change", "samples/s (95% band)", "vs script", "median step", "data wait", "steps", "trial"):
        t.add_column(col, justify="left" if col == "DataLoader change" else "right")
    base = result.baseline.samples_per_s or 0
    for tr in result.trials:
        rate = tr.samples_per_s
        mark = " ★" if tr is result.best else ""
        again = f" (re-measured {tr.repeat})" if tr.repeat else ""
        t.add_row(_settings(tr.overrides) + again + mark, _rate(tr),
                  f"×{rate / base:.2f}" if rate and base else "—",
                  fmt_duration(tr.step_time_s) if tr.step_time_s else "—",
                  f"{100 * tr.data_wait_fraction:.0f}%" if tr.data_wait_fraction is not None else "—",
                  str(tr.steps), f"{tr.seconds:.0f}s" + (" (resumed)" if tr.resumed else ""))
    out.print(t)
    b = result.baseline
    out.print(f"the script as it is: {_settings(b.loader)}; batch {b.batch_size} samples per step on {b.device}")
    if result.speedup and result.best is not result.baseline:
        out.print(f"best: {_settings(result.best.overrides)} — ×{result.speedup:.2f} the script's samples/s")
    if result.decision.get("reason"):
        out.print(f"decision: {result.decision['reason']}", markup=False)
    out.print("\n" + change + "\n", markup=False)
    for f in result.best.advice:
        out.print(f"advice ({f['kind']}): {f['evidence']}; {f['fix']}", markup=False)
    out.print(f"batch size and precision were measured, not changed (batch {b.batch_size}): they change what the "
              "script computes; `gpuwise estimate` / `gpuwise tune WORKLOAD` search them on a workload file",
              markup=False)
    for note in result.notes:
        out.print(f"[yellow]note:[/yellow] {note}")
    out.print(f"{len(result.trials)} trials in {result.elapsed_s:.0f}s of a {budget_s:.0f}s budget"
              + (f"; results in {results_path} (a rerun resumes)" if results_path else ""))
