"""Rendering of the demo report."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from ..units import fmt_bytes, fmt_count, fmt_duration
from .console import out


def render_demo(r: dict[str, Any]) -> None:
    dev = r["devices"]
    if dev["gpus"]:
        out.print(f"[bold]Devices[/bold]: {len(dev['gpus'])} GPU(s) via {dev['backend']}; "
                  f"picked {r.get('picked', {}).get('cuda_visible_devices', '-')}")
    else:
        out.print(f"[bold]Devices[/bold]: no GPU ({dev['reason']}) — running on the CPU")
    out.print(f"[bold]Workload[/bold]: {r['workload']}, {r['parameters']:,} parameters, batch {r['batch_size']}")
    t = Table(title="Training step", title_justify="left")
    t.add_column("")
    t.add_column("value", justify="right")
    plan, meas, plan_gpu = r.get("plan"), r.get("measure"), r.get("plan_gpu")
    if plan:
        t.add_row(f"planned peak ({plan['target']}, {plan.get('method', '')})", fmt_bytes(plan["peak_allocated_bytes"]))
        for cat, nbytes in plan["by_category"].items():
            if nbytes:
                t.add_row(f"  {cat}", fmt_bytes(nbytes))
        t.add_row("FLOPs per step", fmt_count(plan.get("flops_per_step"), "FLOP"))
    if meas:
        peak = meas.get("peak_allocated_bytes")
        t.add_row(f"measured peak ({meas.get('device', r['device'])})", fmt_bytes(peak))
        if plan and peak:
            t.add_row("  plan error", f"{(plan['peak_allocated_bytes'] - peak) / peak:+.2%}")
        t.add_row("measured step time (median)", fmt_duration(meas.get("step_time_s")))
        t.add_row("samples/s", f"{meas.get('samples_per_s') or 0:.1f}")
    if plan_gpu:
        t.add_row(f"on {plan_gpu.get('gpu') or 'GPU'}: nvidia-smi would show", fmt_bytes(plan_gpu.get("device_used_bytes")))
        t.add_row(f"on {plan_gpu.get('gpu') or 'GPU'}: largest batch that fits", str(plan_gpu.get("max_batch_size")))
    out.print(t)
