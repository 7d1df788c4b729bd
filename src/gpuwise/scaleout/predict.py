"""Scaling predicted from the communication model, to print next to the measured scaling (`gpuwise scale`).

With the per-rank batch fixed, a rank's compute per step does not change with the number of ranks, so

    predicted step(n)       = step_s(1) + all_reduce_s(gradient bytes, n, link)   (no overlap: a lower bound
                                                                                on efficiency)
    predicted efficiency(n) = step_s(1) / predicted step(n)

`step_s(1)` (1 rank: forward, backward, optimizer, no communication) and the gradient bytes are the 1-rank
measurement's; the all-reduce time is the alpha-beta
ring model of plan/speed/comm.py (nccl-tests' bus bandwidth). CPU ranks talk gloo over the host's loopback,
which comm.py's table (NCCL links) does not hold: it is measured here (`measure_gloo_loopback`: two gloo
process groups in this process, all-reducing over 127.0.0.1); `GLOO_LOOPBACK` is the assumption used only
when that probe fails, said so; `--link NAME` picks any of comm.py's links instead.

CPU ranks share the host's cores: with n ranks of t intra-op threads on c cores, n x t > c time-shares the
cores, so each rank's compute takes n x t / c times as long (predicted so). When other processes were
runnable on the host (load average) the cores left to the ranks are unknown: the prediction says "cannot
tell" and why (`prediction_caveat`) instead of a number.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from ..plan.speed.comm import LINKS, Link, all_reduce_s, get_link

# gloo's ring all-reduce between processes of one host runs over TCP on the loopback device: every byte is
# copied user -> kernel -> user, and the reduction runs on the same cores. Assumed 2 GB/s per direction (memory
# copies of a few GB/s per core, two per hop) and 50 us per collective (a TCP round trip on loopback, ~10-30 us,
# plus gloo's per-call work). An assumption, not a measurement: the measured column says how far off it is.
GLOO_LOOPBACK = Link("gloo-loopback", 2e9, 1.0, 50e-6,
                     "assumed: gloo over TCP loopback on one host, 2 GB/s per direction, 50 us per call")
DEFAULT_GPU_LINK = "pcie4"  # a GPU whose link is not known: PCIe 4.0 x16 (the slower common case)


PROBE_BYTES = 8 << 20  # one all-reduce of 8 MiB: long enough that the per-call latency is a small part
PROBE_REPEATS = 3
OTHER_LOAD_IGNORED = 0.5  # runnable processes of others below this (load average) leave the cores to the ranks


@dataclass(frozen=True)
class Predicted:
    nproc: int
    communication_s: float
    step_s: float
    efficiency: float
    caveat: str | None = None   # set: the number is not a prediction ("cannot tell ...")


@dataclass(frozen=True)
class Host:
    """What CPU ranks share: cores this process may run on, each rank's intra-op threads, and the load
    average of others from before the ranks started (None: not sampled)."""
    cores: int
    threads_per_rank: int = 1
    other_load: float | None = None


def host_now(threads_per_rank: int) -> Host:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return Host(cores, threads_per_rank, os.getloadavg()[0] if hasattr(os, "getloadavg") else None)


def measure_gloo_loopback(nbytes: int = PROBE_BYTES, repeats: int = PROBE_REPEATS) -> Link | None:
    """gloo's all-reduce between two ranks on this host, measured: two `ProcessGroupGloo`s in this process
    (threads) over 127.0.0.1 time a 4-byte and an `nbytes` all-reduce `repeats` times each. Latency is the
    small one; bus bandwidth (nccl-tests' definition, 2(n-1)/n x bytes / time, = bytes / time at n = 2) the
    large one less the latency. None when gloo cannot be set up here."""
    import datetime
    import threading

    try:
        import torch
        import torch.distributed as dist

        store = dist.HashStore()
        times: dict[int, tuple[float, float]] = {}
        errors: list[BaseException] = []

        def rank(r: int) -> None:
            try:
                opts = dist.ProcessGroupGloo._Options()
                opts._timeout = datetime.timedelta(seconds=60)
                opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
                pg = dist.ProcessGroupGloo(store, r, 2, opts)
                small, big = torch.zeros(1), torch.zeros(nbytes // 4)
                pg.allreduce([small]).wait()
                pg.allreduce([big]).wait()
                t0 = time.perf_counter()
                for _ in range(repeats):
                    pg.allreduce([small]).wait()
                t1 = time.perf_counter()
                for _ in range(repeats):
                    pg.allreduce([big]).wait()
                times[r] = ((t1 - t0) / repeats, (time.perf_counter() - t1) / repeats)
            except BaseException as e:  # noqa: BLE001 -- reported as "no probe"
                errors.append(e)

        threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        if errors or len(times) < 2:
            return None
    except Exception:  # noqa: BLE001 -- no gloo here: the assumption is used (said so)
        return None
    latency = max(t[0] for t in times.values())
    large = max(t[1] for t in times.values())
    busbw = nbytes / max(large - latency, 1e-9)
    return Link("gloo-loopback", busbw, 1.0, latency,
                f"measured here: gloo all-reduce over 127.0.0.1 between 2 ranks, {nbytes} B in {large * 1e3:.2f} ms, "
                f"4 B in {latency * 1e6:.0f} us (mean of {repeats})")


def link_for(device: str, name: str | None = None, measure: bool = False) -> Link:
    """The link between ranks: `name` (comm.py's LINKS), else for CPU ranks gloo loopback (measured when
    `measure`, else or when the probe fails the assumption), else PCIe 4."""
    if name:
        return get_link(name)
    if device == "cpu":
        return (measure_gloo_loopback() if measure else None) or GLOO_LOOPBACK
    return LINKS[DEFAULT_GPU_LINK]


def predict(nprocs: list[int], step_1_s: float, gradient_bytes: int, link: Link,
            host: Host | None = None) -> list[Predicted]:
    """Predicted step and efficiency at each size from the 1-rank step (pure). `host` (CPU ranks): compute
    stretched by n x threads / cores when that exceeds 1; "cannot tell" when others were running."""
    out = []
    for n in nprocs:
        comm = all_reduce_s(gradient_bytes, n, link, gpus_per_node=n) if n > 1 else 0.0  # one host
        compute = step_1_s
        caveat = None
        if host is not None and n > 1:
            demand = n * host.threads_per_rank
            compute = step_1_s * max(1.0, demand / host.cores)
            other = host.other_load
            if other is None:
                caveat = "cannot tell: the host's load before the run is unknown (cores left to the ranks unknown)"
            elif other >= OTHER_LOAD_IGNORED and demand + other > host.cores:
                caveat = (f"cannot tell: {other:.1f} other runnable processes (load average) on {host.cores} cores "
                          f"beside {n} ranks x {host.threads_per_rank} threads; the cores left to the ranks vary")
        step = compute + comm
        out.append(Predicted(n, comm, step, step_1_s / step if step > 0 else 0.0, caveat))
    return out


def attach(result, link_name: str | None = None, host: Host | None = None, measure_link: bool = False) -> None:
    """Fill each point's `predicted_efficiency` / `predicted_communication_s` / `prediction_caveat` and the
    result's `link`. A caveat leaves `predicted_efficiency` None (cannot tell)."""
    one = next((p for p in result.points if p.nproc == 1), None)
    if one is None:
        return
    link = link_for(result.device, link_name, measure=measure_link)
    host = host if result.device == "cpu" else None
    for p, pred in zip(result.points, predict([p.nproc for p in result.points], one.step_s, one.gradient_bytes,
                                               link, host)):
        p.predicted_efficiency = None if pred.caveat else pred.efficiency
        p.predicted_communication_s = pred.communication_s
        p.prediction_caveat = pred.caveat
    result.link = {"name": link.name, "busbw_bytes_per_s": link.busbw_bytes_per_s, "latency_s": link.latency_s,
                   "source": link.source, "assumed": link_name is None and not link.source.startswith("measured")}
