"""Scaling predicted from the communication model, to print next to the measured scaling (`gpuwise scale`).

With the per-rank batch fixed, a rank's compute per step does not change with the number of ranks, so

    predicted step(n)       = step_s(1) + all_reduce_s(gradient bytes, n, link)   (no overlap: a lower bound
                                                                                on efficiency)
    predicted efficiency(n) = step_s(1) / predicted step(n)

`step_s(1)` (1 rank: forward, backward, optimizer, no communication) and the gradient bytes are the 1-rank
measurement's; the all-reduce time is the alpha-beta
ring model of plan/speed/comm.py (nccl-tests' bus bandwidth). CPU ranks talk gloo over the host's loopback,
which comm.py's table (NCCL links) does not hold: `GLOO_LOOPBACK` below is an assumption, said so wherever
it is used; `--link NAME` picks any of comm.py's links instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..plan.speed.comm import LINKS, Link, all_reduce_s, get_link

# gloo's ring all-reduce between processes of one host runs over TCP on the loopback device: every byte is
# copied user -> kernel -> user, and the reduction runs on the same cores. Assumed 2 GB/s per direction (memory
# copies of a few GB/s per core, two per hop) and 50 us per collective (a TCP round trip on loopback, ~10-30 us,
# plus gloo's per-call work). An assumption, not a measurement: the measured column says how far off it is.
GLOO_LOOPBACK = Link("gloo-loopback", 2e9, 1.0, 50e-6,
                     "assumed: gloo over TCP loopback on one host, 2 GB/s per direction, 50 us per call")
DEFAULT_GPU_LINK = "pcie4"  # a GPU whose link is not known: PCIe 4.0 x16 (the slower common case)


@dataclass(frozen=True)
class Predicted:
    nproc: int
    communication_s: float
    step_s: float
    efficiency: float


def link_for(device: str, name: str | None = None) -> Link:
    """The link assumed between ranks: `name` (comm.py's LINKS), else gloo loopback for CPU ranks, else PCIe 4."""
    if name:
        return get_link(name)
    return GLOO_LOOPBACK if device == "cpu" else LINKS[DEFAULT_GPU_LINK]


def predict(nprocs: list[int], step_1_s: float, gradient_bytes: int, link: Link) -> list[Predicted]:
    """Predicted step and efficiency at each size from the 1-rank step (pure)."""
    out = []
    for n in nprocs:
        comm = all_reduce_s(gradient_bytes, n, link, gpus_per_node=n) if n > 1 else 0.0  # one host
        step = step_1_s + comm
        out.append(Predicted(n, comm, step, step_1_s / step if step > 0 else 0.0))
    return out


def attach(result, link_name: str | None = None) -> None:
    """Fill each point's `predicted_efficiency` / `predicted_communication_s` and the result's `link`."""
    one = next((p for p in result.points if p.nproc == 1), None)
    if one is None:
        return
    link = link_for(result.device, link_name)
    for p, pred in zip(result.points, predict([p.nproc for p in result.points], one.step_s, one.gradient_bytes,
                                               link)):
        p.predicted_efficiency = pred.efficiency
        p.predicted_communication_s = pred.communication_s
    result.link = {"name": link.name, "busbw_bytes_per_s": link.busbw_bytes_per_s, "latency_s": link.latency_s,
                   "source": link.source, "assumed": link_name is None}
