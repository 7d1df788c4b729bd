"""FLOPs per step and a roofline bound on a named GPU.

FLOPs come from the trace (torch.utils.flop_counter's per-op formulas, counted in the same pass), or,
when a trace has none, from `FlopCounterMode` over a forward + backward on meta tensors.

Roofline (Williams, Waterman & Patterson, "Roofline", CACM 2009): a step takes at least
max(FLOPs / peak FLOP/s, bytes moved / memory bandwidth). The bytes are a stated lower bound on HBM
traffic, from the steady-state breakdown:

    parameters        read in forward, read in backward, read + written by the optimizer  -> 4x
    gradients         written in backward, read by the optimizer                            -> 2x
    optimizer state   read + written by the optimizer                                      -> 2x
    activations       written in forward, read in backward                                 -> 2x

Real kernels move more (re-reads, temporaries), so the time is a lower bound and samples/s an upper
bound: what the GPU could do at 100% of its datasheet peak.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..step import move_to
from .catalog import GpuSpec

# category -> times its bytes cross HBM in one step (see the module docstring)
TRAFFIC_MULTIPLIERS = {"parameters": 4, "gradients": 2, "optimizer_state": 2, "activations": 2}


@dataclass(frozen=True)
class Roofline:
    gpu: str
    precision: str
    flops_per_step: int
    bytes_per_step: int
    peak_flops: float
    bandwidth_bytes_per_s: float
    compute_s: float
    memory_s: float
    time_s: float
    samples_per_s: float
    bound: str                      # "compute" | "memory"

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def traffic_bytes(by_category: dict[str, int]) -> int:
    """The stated lower bound of bytes moved through HBM in one training step. Gradients are at least
    as large as the parameters (one per trainable parameter), even when the peak falls before they exist."""
    sizes = dict(by_category)
    sizes["gradients"] = max(sizes.get("gradients", 0), sizes.get("parameters", 0))
    return sum(sizes.get(cat, 0) * m for cat, m in TRAFFIC_MULTIPLIERS.items())


def roofline(flops_per_step: int, bytes_per_step: int, batch_size: int, gpu: GpuSpec, precision: str) -> Roofline:
    peak = gpu.peak_flops(precision)
    compute_s = flops_per_step / peak if peak else 0.0
    memory_s = bytes_per_step / gpu.bandwidth_bytes_per_s
    time_s = max(compute_s, memory_s)
    return Roofline(
        gpu=gpu.name, precision=precision, flops_per_step=int(flops_per_step), bytes_per_step=int(bytes_per_step),
        peak_flops=peak, bandwidth_bytes_per_s=gpu.bandwidth_bytes_per_s, compute_s=compute_s, memory_s=memory_s,
        time_s=time_s, samples_per_s=batch_size / time_s if time_s > 0 else 0.0,
        bound="compute" if compute_s >= memory_s else "memory",
    )


def count_flops(workload, batch_size: int) -> int | None:
    """FLOPs of forward + backward on meta tensors (no memory, no data); None when the model cannot run there."""
    from torch.utils.flop_counter import FlopCounterMode

    try:
        model = workload.build_model().to("meta")
        batch = move_to(workload.build_batch(batch_size), "meta")
        with FlopCounterMode(display=False) as counter:
            loss = workload.compute_loss(model, batch)
            loss.backward()
        return int(counter.get_total_flops())
    except Exception:  # data-dependent ops (.item()) and ops without meta kernels: no count, not an error
        return None
