"""Watch's GPU-health findings from fake samples: clocks held down (thermal / power / hardware) for a
sustained part of the run, and host->device copies far below the PCIe link's bandwidth."""

from __future__ import annotations

from gpuwise.monitoring.sampler import Sampler, fake_sample
from gpuwise.monitoring.summary import summarize
from gpuwise.monitoring.timeline import Sample, StepRecord, Timeline
from gpuwise.units import MIB

POWER, THERMAL, IDLE, HW = 0x04, 0x20, 0x01, 0x08  # NVML clock event reason bits (devices.health.CLOCK_REASONS)


def timeline(reasons: list[int], copy_s: float = 0.001, batch_bytes: int = 64 * MIB, pinned: float | None = 1.0,
             gen: int = 4, gen_max: int = 4, width: int = 16) -> Timeline:
    """20 steps of 100 ms (copy `copy_s` of it), one GPU sample per step with the given clock reasons."""
    tl = Timeline(meta={"device": "cuda:0", "device_name": "NVIDIA A100-SXM4-80GB", "batch_bytes": batch_bytes,
                        "pinned_fraction": pinned, "precision": "bf16", "batch_size": 64})
    for i in range(20):
        tl.steps.append(StepRecord(step=i, start_s=0.1 * i, total_s=0.1, data_s=0.001, copy_s=copy_s,
                                   compute_s=0.099 - copy_s))
    for i, mask in enumerate(reasons):
        tl.samples.append(Sample(t_s=0.1 * i + 0.05, gpus={0: {
            "utilization_pct": 97.0, "memory_used_bytes": 70e9, "memory_total_bytes": 80e9,
            "clock_reasons": mask, "sm_clock_mhz": 1100.0 if mask & (POWER | THERMAL | HW) else 1980.0,
            "sm_clock_max_mhz": 1980.0, "temperature_c": 70.0 + i, "pcie_gen": gen, "pcie_width": width, "pcie_gen_max": gen_max,
            "pcie_width_max": 16}}))
    return tl


def finding(tl: Timeline, kind: str) -> dict | None:
    return next((f for f in summarize(tl)["findings"] if f["kind"] == kind), None)


def test_sustained_power_cap_is_a_finding():
    # samples 1-11 of the 19 in the steady window (step 0 is warm-up) at the power limit: 11/19 = 58% >= 25%
    tl = timeline([POWER] * 12 + [0] * 8)
    f = finding(tl, "clock_throttling")
    stats = summarize(tl)["gpu_health"]
    assert stats["clock_samples"] == 19 and round(stats["power_fraction"], 2) == round(11 / 19, 2)
    assert f is not None and "clocks held down by the power limit in 58% of 19 samples" in f["evidence"]
    assert "SM clock median 1100 of 1980 MHz" in f["evidence"] and "nvidia-smi -q -d POWER" in f["fix"]


def test_thermal_and_hardware_name_their_fixes():
    f = finding(timeline([THERMAL] * 10 + [HW | THERMAL] * 10), "clock_throttling")
    assert "by temperature in 100%" in f["evidence"] and "a hardware slowdown signal in 53%" in f["evidence"]
    assert "cool the GPU" in f["fix"] and "power cables" in f["fix"]
    assert "hottest sample 89 °C" in f["evidence"]  # 70 + 19: the last sample in the steady window


def test_a_blip_or_idle_is_not_sustained():
    assert finding(timeline([POWER] * 3 + [0] * 17), "clock_throttling") is None  # 2 of 19 = 11% < 25%
    assert finding(timeline([IDLE] * 20), "clock_throttling") is None
    assert finding(timeline([POWER] * 4), "clock_throttling") is None  # fewer than 5 samples: cannot tell


def test_slow_pinned_copy_on_a_full_link():
    # 64 MiB in 20 ms = 67108864 / 0.020 = 3.36 GB/s; gen4 x16 = 1.969 * 16 = 31.5 GB/s -> 11% < 25%
    f = finding(timeline([0] * 20, copy_s=0.020), "slow_host_copy")
    assert f is not None and "3.36 GB/s" in f["evidence"] and "11% of the PCIe gen4 x16 link's 31.5 GB/s" in f["evidence"]
    assert "latency-bound" in f["fix"]


def test_slow_copy_names_pageable_memory_and_a_downgraded_link():
    f = finding(timeline([0] * 20, copy_s=0.020, pinned=0.0, gen=3, gen_max=4), "slow_host_copy")
    # gen3 x16 = 0.985 * 16 = 15.8 GB/s; 3.36 / 15.8 = 21%
    assert "21% of the PCIe gen3 x16 link's 15.8 GB/s" in f["evidence"] and "pageable" in f["evidence"]
    assert "never reached its gen4 x16 (31.5 GB/s)" in f["evidence"]
    assert "pin_memory=True" in f["fix"] and "reseat" in f["fix"]


def test_fast_copy_or_no_link_data_is_quiet():
    # 512 MiB in 20 ms = 536870912 / 0.020 = 26.8 GB/s = 85% of 31.5 GB/s (copies still 20% of the step)
    assert finding(timeline([0] * 20, copy_s=0.020, batch_bytes=512 * MIB), "slow_host_copy") is None
    # slow, but copies are 1% of the step (1 ms of 100 ms < 5%): not worth a finding
    assert finding(timeline([0] * 20, copy_s=0.001, batch_bytes=1 * MIB), "slow_host_copy") is None
    tl = timeline([0] * 20, copy_s=0.020)
    for s in tl.samples:
        s.gpus[0].pop("pcie_gen")
    assert finding(tl, "slow_host_copy") is None  # no link facts: cannot compare, so no claim


def test_sampler_records_the_health_fields_from_fake_gpus(write_fake):
    write_fake([{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "memory_used_mib": 1000,
                 "utilization_pct": 99, "clock_reasons": ["sw_power_cap"], "sm_clock_mhz": 1600, "sm_clock_max_mhz": 1980,
                 "pcie_gen_current": 5, "pcie_gen_max": 5, "pcie_width_current": 16, "pcie_width_max": 16}])
    s = fake_sample(0)
    assert s["clock_reasons"] == POWER and s["pcie_gen"] == 5 and s["pcie_width"] == 16 and s["sm_clock_mhz"] == 1600
    tl = Timeline()
    sampler = Sampler(tl, gpu_indices=[0], gpu_source=fake_sample)
    for _ in range(6):
        sampler.sample_once()
    assert summarize(tl)["gpu_health"]["power_fraction"] == 1.0


def test_watch_table_shows_clocks_and_link():
    from gpuwise.report.monitor import health_rows

    rows = dict(health_rows(summarize(timeline([POWER] * 12 + [0] * 8, gen=3, gen_max=4))["gpu_health"]))
    # SM clock: 11 samples at 1100, 8 at 1980 -> median 1100; gen3 x16 = 15.8 GB/s of a gen4 x16 link
    assert rows["GPU clocks"] == "SM median 1100 of 1980 MHz; held by heat 0%, power 58%, hardware 0% of 19 samples; hottest 89 °C"
    assert rows["PCIe link"] == "gen3 x16 (15.8 GB/s), max gen4 x16"
