"""GPU health during a run (the doctor's clock and PCIe facts, over time): sample statistics and two rules.

`health_stats(timeline, window)` condenses the sampler's `clock_reasons` bitmasks, SM clocks and PCIe
link/throughput fields (devices.nvml.sample, or the fake-GPU file) into `Summary.gpu_health`; the rules
`clock_throttling` and `slow_host_copy` read it. Thresholds are this project's judgement, each with its
reason.
"""

from __future__ import annotations

import statistics
from typing import Any

from ..devices.health import (
    HW_REASONS,
    POWER_REASONS,
    THERMAL_REASONS,
    pcie_bandwidth_bytes_per_s,
    reason_names,
)
from ..units import fmt_bytes, fmt_duration
from .result import Summary
from .rules import COPY_FRACTION, Finding, rule
from .timeline import Timeline

SUSTAINED_FRACTION = 0.25  # held down in a quarter of the samples: not a blip, a steady cost
MIN_SAMPLES = 5            # fewer samples cannot tell "sustained" from a blip
SLOW_COPY_FRACTION = 0.25  # below a quarter of the link: pinned copies reach ~80% of it (NVIDIA, "How to
                           # Optimize Data Transfers in CUDA C/C++", pinned vs pageable bandwidthTest)


def _frac(n: int, total: int) -> float:
    return n / total if total else 0.0


def health_stats(tl: Timeline, window: tuple[float, float] | None) -> dict[str, Any]:
    """Clock-reason fractions, SM clock, PCIe link and host->device throughput over the samples in `window`."""
    reasons_seen = thermal = power = hw = 0
    clocks, clock_max, gens, widths, gen_max, width_max, rx, temps = [], [], [], [], [], [], [], []
    for s in tl.samples:
        if window and not (window[0] <= s.t_s <= window[1]):
            continue
        for g in s.gpus.values():
            mask = g.get("clock_reasons")
            if isinstance(mask, (int, float)):
                names = set(reason_names(int(mask)) or ())
                reasons_seen += 1
                thermal += bool(names & THERMAL_REASONS)
                power += bool(names & POWER_REASONS)
                hw += bool(names & (HW_REASONS - THERMAL_REASONS - POWER_REASONS))
            for key, out in (("sm_clock_mhz", clocks), ("sm_clock_max_mhz", clock_max), ("pcie_gen", gens),
                             ("pcie_width", widths), ("pcie_gen_max", gen_max), ("pcie_width_max", width_max),
                             ("pcie_rx_bytes_per_s", rx), ("temperature_c", temps)):
                if isinstance(g.get(key), (int, float)):
                    out.append(float(g[key]))
    gen, width = (int(max(gens)) if gens else None), (int(max(widths)) if widths else None)  # busy links run at their top
    top_gen, top_width = (int(max(gen_max)) if gen_max else None), (int(max(width_max)) if width_max else None)
    return {
        "clock_samples": reasons_seen,
        "thermal_fraction": _frac(thermal, reasons_seen), "power_fraction": _frac(power, reasons_seen),
        "hw_slowdown_fraction": _frac(hw, reasons_seen),
        "sm_clock_median_mhz": statistics.median(clocks) if clocks else None,
        "sm_clock_max_mhz": max(clock_max) if clock_max else None,
        "pcie_gen": gen, "pcie_width": width, "pcie_gen_max": top_gen, "pcie_width_max": top_width,
        "pcie_bandwidth_bytes_per_s": pcie_bandwidth_bytes_per_s(gen, width),
        "pcie_max_bandwidth_bytes_per_s": pcie_bandwidth_bytes_per_s(top_gen, top_width),
        "pcie_rx_mean_bytes_per_s": statistics.fmean(rx) if rx else None,
        "temperature_max_c": max(temps) if temps else None,
    }


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


@rule("clock_throttling")
def clock_throttling(s: Summary) -> Finding | None:
    h = s.gpu_health or {}
    n = h.get("clock_samples") or 0
    if n < MIN_SAMPLES:
        return None
    parts = [(h["thermal_fraction"], "temperature"), (h["power_fraction"], "the power limit"),
             (h["hw_slowdown_fraction"], "a hardware slowdown signal")]
    held = [(frac, why) for frac, why in parts if frac >= SUSTAINED_FRACTION]
    if not held:
        return None
    evidence = "; ".join(f"clocks held down by {why} in {_pct(frac)} of {n} samples" for frac, why in held)
    if h.get("sm_clock_median_mhz") and h.get("sm_clock_max_mhz"):
        evidence += f" (SM clock median {h['sm_clock_median_mhz']:.0f} of {h['sm_clock_max_mhz']:.0f} MHz)"
    if h.get("temperature_max_c") is not None:
        evidence += f"; hottest sample {h['temperature_max_c']:.0f} °C"
    fixes = []
    if h["thermal_fraction"] >= SUSTAINED_FRACTION:
        fixes.append("cool the GPU: airflow, fan curve, inlet temperature (`gpuwise doctor` shows the slowdown "
                     "threshold); a lower power limit (`sudo nvidia-smi -pl WATTS`) trades a little speed for heat")
    if h["power_fraction"] >= SUSTAINED_FRACTION:
        fixes.append("power-limited: compare the limit with the default (`nvidia-smi -q -d POWER`) and restore it "
                     "if it was lowered; otherwise this is the card's ceiling for these kernels")
    if h["hw_slowdown_fraction"] >= SUSTAINED_FRACTION:
        fixes.append("hardware slowdown: check the power cables and supply, and the board (`nvidia-smi -q -d PERFORMANCE`)")
    return Finding("clock_throttling", evidence, "; ".join(fixes))


@rule("slow_host_copy")
def slow_host_copy(s: Summary) -> Finding | None:
    h = s.gpu_health or {}
    link = h.get("pcie_bandwidth_bytes_per_s")
    copy = s.copy_fraction
    copy_s = ((s.split or {}).get("copy_s") or {}).get("median")
    nbytes = s.batch_bytes
    if not link or not isinstance(copy, (int, float)) or copy < COPY_FRACTION or not copy_s or not nbytes:
        return None
    rate = nbytes / copy_s
    if rate >= SLOW_COPY_FRACTION * link:
        return None
    top = h.get("pcie_max_bandwidth_bytes_per_s")
    downgraded = bool(top and top > link)
    evidence = (f"host-to-device copies run at {rate / 1e9:.2f} GB/s (median {fmt_duration(copy_s)} for "
                f"{fmt_bytes(nbytes)}), {_pct(rate / link)} of the PCIe gen{h['pcie_gen']} x{h['pcie_width']} link's "
                f"{link / 1e9:.1f} GB/s, and take {_pct(copy)} of step time")
    fixes = []
    pinned = s.pinned_fraction
    loader_pinned = (s.loader or {}).get("pin_memory")
    if pinned != 1.0 and not (pinned is None and loader_pinned is True):
        evidence += "; the batches are in pageable memory" if pinned is not None or loader_pinned is False else ""
        fixes.append("DataLoader(pin_memory=True) and .to(device, non_blocking=True): pageable copies go through a "
                     "staging buffer at a fraction of the link")
    if downgraded:
        evidence += (f"; the link never reached its gen{h['pcie_gen_max']} x{h['pcie_width_max']} "
                     f"({top / 1e9:.1f} GB/s) during the run")
        fixes.append("the link is downgraded: reseat the card in a full x16 slot, check risers and the BIOS PCIe "
                     "setting (`gpuwise doctor` shows the link)")
    if not fixes:
        fixes.append("copies this slow with pinned memory on a full link are latency-bound: copy fewer, larger "
                     "tensors (one contiguous batch) or build the batch on the GPU")
    return Finding("slow_host_copy", evidence, "; ".join(fixes))
