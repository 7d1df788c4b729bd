"""Memory: the step's events (`events.py`, the interface the tracer writes) and what is computed from them.

`allocator.py` replays them through a model of the CUDA caching allocator; `overheads.py` adds library
workspaces and the CUDA context; `warmup.py` the warm-up step; `synth.py` events at an untraced batch size;
`split.py` the data-parallel strategies (`Split`); `fsdp_units.py` FSDP's units and what it holds unsharded;
`sharding.py` per-rank events across N GPUs; `ddp.py` the data-parallel formula; `nccl.py` the NCCL
communicator buffers a rank of N holds outside the allocator.
"""
