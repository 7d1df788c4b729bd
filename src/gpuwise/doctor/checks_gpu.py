"""Checks of each GPU the job can see: MIG, compute mode, memory held by others, persistence mode, ECC,
PCIe link, clocks held down, temperature. One `Check` per question, its evidence naming each GPU.

A GPU counts when CUDA_VISIBLE_DEVICES lets the job see it (all GPUs when it is unset or unusable).
A field the backend did not report makes that GPU "not reported", never "ok".
"""

from __future__ import annotations

from collections.abc import Callable

from ..devices.health import HW_REASONS, POWER_REASONS, THERMAL_REASONS, GpuHealth, pcie_bandwidth_bytes_per_s
from ..units import fmt_bytes
from . import checks_setup, visible  # noqa: F401  (checks_setup first: the registry runs in import order)
from .facts import Facts
from .model import OK, PROBLEM, SKIPPED, WARNING, Check, Options, check

RANK = {OK: 0, SKIPPED: 0, WARNING: 1, PROBLEM: 2}
BUSY_UTIL_PCT = 30.0          # above this a GPU is "in use": an idle GPU lowers its link and clocks by design
HELD_BY_OTHERS_FRACTION = 0.10  # others holding > 10% of a GPU's memory is worth naming
TEMPERATURE_MARGIN_C = 5.0    # within 5 °C of the slowdown threshold: clocks are about to drop
NO_PROCESS_USED_BYTES = 1 << 30  # > 1 GiB used with no process listed: held by something we cannot see


def relevant(f: Facts) -> list[GpuHealth]:
    """The GPUs this job would use: those CUDA_VISIBLE_DEVICES selects, else all."""
    value = f.env.get("CUDA_VISIBLE_DEVICES")
    if value is None or not value.strip():
        return list(f.health)
    parsed = visible.parse(value, f.gpus, f.env.get("CUDA_DEVICE_ORDER"))
    chosen = {g.index for g in parsed.visible}
    picked = [h for h in f.health if h.gpu.index in chosen]
    return picked or list(f.health)


def _label(h: GpuHealth) -> str:
    return f"GPU {h.gpu.index}"


def per_gpu(name: str, f: Facts, judge: Callable[[GpuHealth], tuple[str, str, str] | None],
            nothing_to_check: str = "no GPU to check") -> Check:
    """Run `judge(gpu) -> (status, evidence, fix)` (None: not reported) on each relevant GPU and merge:
    the worst status wins; evidence lists every GPU; fixes of the non-ok GPUs, once each."""
    gpus = relevant(f)
    if not gpus:
        return Check(name, SKIPPED, nothing_to_check)
    results = [(h, judge(h)) for h in gpus]
    reported = [(h, r) for h, r in results if r is not None]
    if not reported:
        return Check(name, SKIPPED, f"not reported for {', '.join(_label(h) for h in gpus)} (backend: {f.backend})")
    status = max((r[0] for _, r in reported), key=RANK.__getitem__)
    evidence = "; ".join(f"{_label(h)}: {r[1]}" for h, r in reported)
    missing = [h for h, r in results if r is None]
    if missing:
        evidence += f"; not reported for {', '.join(_label(h) for h in missing)}"
    fixes = []
    for _, r in reported:
        if r[0] in (WARNING, PROBLEM) and r[2] and r[2] not in fixes:
            fixes.append(r[2])
    return Check(name, status, evidence, "; ".join(fixes))


@check("mig")
def mig(f: Facts, o: Options) -> Check:
    def judge(h: GpuHealth):
        if h.mig_enabled is None:
            return None
        if not h.mig_enabled:
            return OK, "MIG off", ""
        if not h.mig_devices:
            return (PROBLEM, "MIG on with no instance created: CUDA sees no device on it",
                    f"create instances (`sudo nvidia-smi mig -i {h.gpu.index} -cgi <profile> -C`) or turn MIG off "
                    f"(`sudo nvidia-smi -i {h.gpu.index} -mig 0`, then reset the GPU)")
        names = ", ".join(f"{m.name or '?'} {m.uuid}" for m in h.mig_devices)
        return (WARNING, f"MIG on, {len(h.mig_devices)} instance(s): {names}; CUDA shows instances, not the whole GPU, "
                "and one process uses one instance",
                "name one instance: CUDA_VISIBLE_DEVICES=MIG-<uuid> (one per process; DDP needs one process per "
                "instance), or turn MIG off for whole-GPU training")
    return per_gpu("mig", f, judge)


@check("compute_mode")
def compute_mode(f: Facts, o: Options) -> Check:
    def judge(h: GpuHealth):
        mode = h.compute_mode
        if mode is None:
            return None
        procs = h.gpu.processes
        if mode == "prohibited":
            return (PROBLEM, "compute mode PROHIBITED: no CUDA context may be created on it",
                    f"`sudo nvidia-smi -i {h.gpu.index} -c DEFAULT`, or use another GPU")
        if mode.startswith("exclusive"):
            if procs:
                who = ", ".join(f"pid {p.pid}" + (f" ({p.user})" if p.user else "") for p in procs)
                return (PROBLEM, f"compute mode {mode.upper()} and already taken by {who}: a second process cannot "
                        "create a context (cudaErrorDevicesUnavailable)",
                        "use another GPU (`gpuwise pick`), or wait for that process to end")
            return OK, f"compute mode {mode.upper()}, free: one process at a time (DataLoader workers must not use CUDA)", ""
        return OK, "compute mode DEFAULT", ""
    return per_gpu("compute_mode", f, judge)


@check("gpu_memory_held")
def gpu_memory_held(f: Facts, o: Options) -> Check:
    def judge(h: GpuHealth):
        g = h.gpu
        zombies = [p for p in g.processes if f.process_states.get(p.pid) == "zombie"]
        unseen = [p for p in g.processes if f.process_states.get(p.pid) == "absent"]
        held = sum(p.used_bytes or 0 for p in g.processes)
        total = g.memory_total_bytes or 1
        if zombies:
            who = ", ".join(f"pid {p.pid} ({fmt_bytes(p.used_bytes)})" for p in zombies)
            return (PROBLEM, f"zombie process(es) still hold memory: {who}",
                    "kill the zombie's parent (`ps -o ppid= -p PID`), or `sudo fuser -v /dev/nvidia*` to find the "
                    f"holders; when nothing else runs on it, `sudo nvidia-smi --gpu-reset -i {g.index}`")
        parts = []
        if g.processes:
            parts.append(", ".join(f"pid {p.pid}" + (f" ({p.user})" if p.user else "") + f" {fmt_bytes(p.used_bytes)}"
                                   for p in g.processes))
        if unseen:
            parts.append(f"pid {', '.join(str(p.pid) for p in unseen)} not in this PID namespace (another container, or "
                         "ended without the driver noticing yet)")
        if not g.processes and g.memory_used_bytes > NO_PROCESS_USED_BYTES:
            return (WARNING, f"{fmt_bytes(g.memory_used_bytes)} used but no process listed: held by processes outside "
                    "this container, or leaked", "check on the host (`nvidia-smi`); `gpuwise pick` avoids busy GPUs")
        free = f"{fmt_bytes(g.memory_free_bytes)} of {fmt_bytes(g.memory_total_bytes)} free"
        if held / total > HELD_BY_OTHERS_FRACTION:
            return WARNING, f"{free}; held by {'; '.join(parts)}", "use a freer GPU (`gpuwise pick --min-free SIZE`)"
        return OK, free + (f" ({'; '.join(parts)})" if parts else ""), ""
    return per_gpu("gpu_memory_held", f, judge)


@check("persistence_mode")
def persistence_mode(f: Facts, o: Options) -> Check:
    if not f.platform.startswith("linux"):
        return Check("persistence_mode", SKIPPED, f"persistence mode is a Linux driver setting (this is {f.platform})")

    def judge(h: GpuHealth):
        if h.persistence_mode is None:
            return None
        if h.persistence_mode:
            return OK, "persistence mode on", ""
        return (WARNING, "persistence mode off: with no client the driver tears the GPU down, and every job start "
                "pays its re-initialisation (seconds)",
                "`sudo nvidia-smi -pm 1`, or better the nvidia-persistenced daemon (NVIDIA, \"Driver Persistence\")")
    return per_gpu("persistence_mode", f, judge)


@check("ecc")
def ecc(f: Facts, o: Options) -> Check:
    def judge(h: GpuHealth):
        if h.ecc_enabled is None and h.retired_pages_pending is None and h.ecc_uncorrected_volatile is None:
            return None
        if h.retired_pages_pending:
            return (PROBLEM, f"retired pages pending ({h.retired_pages or 0} retired): bad memory is still mapped until "
                    "the GPU is reset", f"reset the GPU when idle (`sudo nvidia-smi --gpu-reset -i {h.gpu.index}`) or "
                    "reboot; if retirements keep growing, have the GPU replaced")
        if h.ecc_uncorrected_volatile:
            return (PROBLEM, f"{h.ecc_uncorrected_volatile} uncorrectable ECC error(s) since the driver loaded: results "
                    "computed on this GPU may be corrupt", "reset the GPU (or reboot) and rerun; if they recur, take it "
                    "out of service (`nvidia-smi -q -d ECC,PAGE_RETIREMENT`)")
        if h.ecc_enabled is False:
            return OK, "ECC off (not available on this GPU, or disabled)", ""
        retired = f", {h.retired_pages} page(s) retired" if h.retired_pages else ""
        return OK, f"ECC on, no uncorrectable errors{retired}", ""
    return per_gpu("ecc", f, judge)


def _link(gen, width) -> str:
    bw = pcie_bandwidth_bytes_per_s(gen, width)
    return f"gen{gen} x{width}" + (f" ({bw / 1e9:.1f} GB/s)" if bw else "")


@check("pcie_link")
def pcie_link(f: Facts, o: Options) -> Check:
    def judge(h: GpuHealth):
        gc, gm, wc, wm = h.pcie_gen_current, h.pcie_gen_max, h.pcie_width_current, h.pcie_width_max
        if None in (gc, gm, wc, wm):
            return None
        now, best = _link(gc, wc), _link(gm, wm)
        busy = (h.gpu.utilization_pct or 0) >= BUSY_UTIL_PCT
        slot = ""
        if h.pcie_gen_gpu_max and h.pcie_gen_gpu_max > gm:
            slot = f"; the GPU supports gen{h.pcie_gen_gpu_max} but the slot/host only gen{gm}"
        if wc < wm:
            return (WARNING, f"link {now}, below its x{wm} width ({best}){slot}: host<->device copies are slower",
                    "reseat the card in an x16 slot, check risers and the BIOS lane (bifurcation) settings")
        if gc < gm and busy:
            return (WARNING, f"link {now} while {h.gpu.utilization_pct:.0f}% busy, below its maximum {best}{slot}",
                    "check the slot and BIOS PCIe speed setting; a link that stays slow under load is downgraded")
        if gc < gm:
            return OK, f"link {now} at idle (max {best}): idle GPUs lower the link speed to save power{slot}", ""
        if slot:
            return WARNING, f"link {now}{slot}", f"a gen{h.pcie_gen_gpu_max} slot gives the full host<->device bandwidth"
        return OK, f"link {now}", ""
    return per_gpu("pcie_link", f, judge)


@check("clocks")
def clocks(f: Facts, o: Options) -> Check:
    def judge(h: GpuHealth):
        reasons = h.clock_reasons
        if reasons is None:
            return None
        clock = ""
        if h.sm_clock_mhz and h.sm_clock_max_mhz:
            clock = f" (SM {h.sm_clock_mhz:.0f} of {h.sm_clock_max_mhz:.0f} MHz)"
        active = [r for r in reasons if r not in ("gpu_idle", "sync_boost", "display_clock_setting")]
        if not active:
            why = "idle" if "gpu_idle" in reasons else "none"
            return OK, f"no clock limit active ({why}){clock}", ""
        text = ", ".join(active) + clock
        hw = [r for r in active if r in HW_REASONS]
        if hw:
            return (PROBLEM, f"clocks held down by the hardware: {text}",
                    "hw slowdown means overheating, a power-supply/brake signal or a failing board: check cooling and "
                    "power cables, `nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER`")
        if any(r in THERMAL_REASONS for r in active):
            return (WARNING, f"clocks held down by temperature: {text}", "improve cooling/airflow, lower the room or "
                    "rack inlet temperature; `gpuwise watch` shows how long it lasts under load")
        if any(r in POWER_REASONS for r in active):
            busy = (h.gpu.utilization_pct or 0) >= BUSY_UTIL_PCT
            return ((WARNING if busy else OK), f"clocks held at the power limit: {text}",
                    "normal for heavy kernels; compare the limit with the default (`nvidia-smi -q -d POWER`) and raise "
                    "it if it was lowered (`sudo nvidia-smi -pl WATTS`)")
        return (WARNING, f"clocks limited by a setting: {text}",
                f"reset application clocks and locked clocks: `sudo nvidia-smi -i {h.gpu.index} -rac` and `-rgc`")
    return per_gpu("clocks", f, judge)


@check("temperature")
def temperature(f: Facts, o: Options) -> Check:
    def judge(h: GpuHealth):
        t, slow, shut = h.gpu.temperature_c, h.temperature_slowdown_c, h.temperature_shutdown_c
        if t is None:
            return None
        limits = ", ".join(x for x in (f"slowdown at {slow:.0f} °C" if slow else "",
                                       f"shutdown at {shut:.0f} °C" if shut else "") if x)
        text = f"{t:.0f} °C" + (f" ({limits})" if limits else " (thresholds not reported)")
        fix = "improve airflow/cooling, check the fans (`nvidia-smi -q -d TEMPERATURE`), lower the power limit"
        if slow and t >= slow:
            return PROBLEM, f"{text}: at the slowdown threshold, clocks are being cut", fix
        if slow and slow - t <= TEMPERATURE_MARGIN_C:
            return WARNING, f"{text}: within {TEMPERATURE_MARGIN_C:.0f} °C of slowdown", fix
        if o.max_temperature_c is not None and t >= o.max_temperature_c:
            return WARNING, f"{text}: above your limit of {o.max_temperature_c:.0f} °C", \
                f"{fix} (`sudo nvidia-smi -pl WATTS` trades a little speed for heat)"
        return OK, text, ""
    return per_gpu("temperature", f, judge)
