"""Tracing: one training step run on fake tensors and written down as memory events (no GPU, no real memory).

`trace.py` runs the step; `setup.py` builds it; `modes.py` applies training modes (LoRA, accumulation, ...),
`quant4bit.py` bitsandbytes' 4-bit layers (QLoRA's base), `losses.py` a causal LM's chunked or fused cross-entropy;
`scope.py`, `accumulation.py`, `stochastic.py`, `compiled.py`, `sdpa.py` handle what a fake trace sees
differently; `kernels.py`, `probe.py`, `probe_scale.py` add what kernels allocate internally; `fallback.py`
and `cpu_truth.py` get the step another way where a fake trace cannot run it.
"""
