"""Plan: predict a training step's memory, FLOPs and time without a GPU.

`estimate(workload, batch_size, ...) -> Estimate` is the entry point; the pieces are the tracer
(`trace.py`), the caching-allocator model (`allocator.py`), process overheads (`overheads.py`), the GPU
catalog (`catalog.py`), FLOPs and roofline (`flops.py`) and memory vs batch size (`curve.py`).
None of them imports torch at module level, so importing this package stays cheap.
"""

from __future__ import annotations

# Imported eagerly (not lazily): the submodule `plan/estimate.py` shares the function's name, and a lazy
# import would leave `gpuwise.plan.estimate` bound to the module instead of the function.
from .catalog import CATALOG, GpuSpec
from .catalog import lookup as lookup_gpu
from .estimate import Estimate, estimate

__all__ = ["estimate", "Estimate", "lookup_gpu", "GpuSpec", "CATALOG"]
