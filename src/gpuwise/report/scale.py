"""Tables and sentences for `gpuwise train` and `gpuwise scale`."""

from __future__ import annotations

import os

from rich.table import Table

from ..plan.memory.ddp import DdpMemoryPlan
from ..scaleout.scale import ScaleResult
from ..units import fmt_bytes


def scale_table(result: ScaleResult) -> Table:
    t = Table(title=f"DDP scaling of {result.workload} ({result.device}, {result.backend}), "
                    f"per-rank batch {result.per_rank_batch_size}", title_justify="left")
    for col in ("ranks", "samples/s", "per rank", "efficiency", "predicted", "step", "compute", "communication",
                "predicted comm", "comm %"):
        t.add_column(col, justify="right")
    for p in result.points:
        pred = (f"{p.predicted_efficiency:.0%}" if p.predicted_efficiency is not None
                else "cannot tell" if getattr(p, "prediction_caveat", None) else "-")
        pred_comm = _ms(p.predicted_communication_s) if p.predicted_communication_s is not None else "-"
        t.add_row(str(p.nproc), f"{p.samples_per_s:,.1f}", f"{p.per_rank_samples_per_s:,.1f}", f"{p.efficiency:.0%}",
                  pred, _ms(p.step_s), _ms(p.compute_s), _ms(p.communication_s), pred_comm,
                  f"{p.communication_fraction:.0%}")
    if result.link:
        how = "" if result.link.get("assumed") or result.link["source"].startswith("measured") else "given: "
        t.caption = (f"predicted: the 1-rank step (stretched when ranks x threads exceed the cores) + a ring all-reduce "
                     f"of the gradients over {result.link['name']} ({how}{result.link['source']}), no overlap")
        caveats = sorted({p.prediction_caveat for p in result.points if getattr(p, "prediction_caveat", None)})
        if caveats:
            t.caption += "; " + "; ".join(caveats)
    return t


def explain(result: ScaleResult) -> list[str]:
    """Sentences: where each size's time goes, the fixed-global-batch case, the learning-rate rule."""
    lines = []
    one = result.points[0]
    for p in result.points[1:]:
        bw = f", {fmt_bytes(p.bus_bandwidth_bytes_per_s)}/s bus bandwidth" if p.bus_bandwidth_bytes_per_s else ""
        lines.append(
            f"{p.nproc} ranks: a step takes {_ms(p.step_s)} = {_ms(p.compute_s)} compute + {_ms(p.communication_s)} "
            f"allreduce of {fmt_bytes(p.gradient_bytes)} gradients and waiting ({p.communication_fraction:.0%}{bw}); "
            f"{p.samples_per_s / one.samples_per_s:.2f}x the samples/s of 1 rank.")
        if p.fixed_global_speedup is not None:
            lines.append(
                f"  Splitting one rank's batch of {result.per_rank_batch_size} over {p.nproc} ranks instead would leave "
                f"~{_ms(one.step_s / p.nproc)} of compute per rank but the same {_ms(p.communication_s)} of "
                f"communication: about {p.fixed_global_speedup:.2f}x, which is why N GPUs can be no faster than one.")
    if result.points[1:] and min(p.efficiency for p in result.points[1:]) < 0.8:
        lines.append("To scale better: a larger per-rank batch (more compute per allreduce), bf16 gradient compression "
                     "(DDP comm hook bf16_compress_hook), "
                     "fewer parameters to synchronise, or faster links (NVLink/InfiniBand).")
    if result.device == "cpu":
        cores = os.cpu_count() or 1
        busiest = max(p.nproc for p in result.points)
        lines.append(f"CPU ranks run one thread each on this machine's {cores} core(s)"
                     + (f"; {busiest} ranks oversubscribe them" if busiest > cores else "")
                     + ": CPU efficiency says little about GPUs, run it where the GPUs are.")
    lines.append(f"Learning rate: {result.lr_rule}.")
    return lines


def memory_table(plan: DdpMemoryPlan, optimizer: str) -> Table:
    t = Table(title=f"Model state per rank at {plan.world_size} rank(s), {optimizer} "
                    f"({len(plan.bucket_sizes_bytes)} DDP bucket(s); activations not included)", title_justify="left")
    for col in ("strategy", "parameters", "gradients", "buckets", "optimizer", "total", ""):
        t.add_column(col, justify="left" if col in ("strategy", "") else "right")
    for r in plan.rows:
        t.add_row(r.strategy, fmt_bytes(r.parameters_bytes), fmt_bytes(r.gradients_bytes), fmt_bytes(r.buckets_bytes),
                  fmt_bytes(r.optimizer_state_bytes), fmt_bytes(r.total_bytes), r.note)
    t.caption = "ZeRO stages: Rajbhandari et al. 2020; zero3/fsdp = FSDP FULL_SHARD"
    return t


def train_summary(result: dict) -> Table:
    t = Table(title="DDP training", title_justify="left", show_header=False)
    t.add_column("", justify="left")
    t.add_column("", justify="right")
    rows = [("ranks", f"{result['world_size']} on {result.get('device', '?')} ({result['backend']})"),
            ("per-rank batch", str(result.get("per_rank_batch_size", ""))),
            ("data", result.get("data", "")),
            ("steps", str(result["steps"])),
            ("samples/s", f"{result['samples_per_s']:,.1f}"),
            ("final loss", "-" if result["final_loss"] is None else f"{result['final_loss']:.4f}")]
    if result.get("resumed_from_step"):
        rows.append(("resumed from step", str(result["resumed_from_step"])))
    if result.get("restarts"):
        rows.append(("torchrun restarts", str(result["restarts"])))
    if result.get("checkpoint"):
        rows.append(("checkpoint", result["checkpoint"]))
    for k, v in rows:
        t.add_row(k, v)
    return t


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"
