"""Step-time model: a predicted training step time from the traced ops (not a roofline bound).

    ops.py            what the trace saw: GEMM shapes, attention kernels, memory-bound bytes, kernel counts
    gemm.py           tile and wave quantisation on the SMs at the matmul efficiency: sustained (MSMF) for 16-bit
                      GEMMs where published, else best-shape (MAMF); plan/catalog.py SpeedSpec
    attention.py      fused SDPA kernels at their published fraction of peak
    memory_bound.py   bytes at the achievable bandwidth
    fusion.py         --compile: what a fusing compiler (Inductor) leaves of the memory-bound ops, per region
    launch.py         per-kernel gap and host dispatch per aten op
    comm.py           NCCL all-reduce / reduce-scatter / all-gather time by bytes, ranks and link
    overlap.py        what DDP buckets / FSDP prefetch hide behind backward and forward
    model.py          predict(): the step, its breakdown, MFU, bound_by
"""
