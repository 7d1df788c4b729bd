"""The batch's host-to-device copy inside the step.

gpuwise's step (step.TrainStep.step, the step the truth records time) moves the batch to the GPU itself with
a blocking `.to(device)` from ordinary (pageable) host memory: the CUDA driver stages a pageable copy through
a pinned buffer with a host-side memcpy, so it runs well below the PCIe link, and the stream waits for it
(NVIDIA CUDA C++ Best Practices Guide, "Pinned Memory" and "Asynchronous and Overlapping Transfers with
Computation": pageable transfers are synchronous and slower than pinned ones).

A pageable host-to-device copy also waits for the work already queued on the stream ("For transfers from
pageable host memory to device memory, a stream sync is performed before the copy is initiated", CUDA Runtime
API, "API synchronization behavior"), and the host thread does the staging: the copy sits on the host's
timeline as well as the GPU's, and the host cannot run ahead into the next step (model.py).

Bandwidth: measured on the H200 truth host, benchmarks/truth/kernels/nvidia-h200.jsonl, resnet50 b64 adamw:
`Memcpy HtoD (Pageable -> Device)`, 2 copies per step (images 64 x 3 x 224 x 224 fp32 + labels, 38.54 MB)
5.144 ms (bf16 run) and 5.277 ms (fp32 run): 7.49 and 7.30 GB/s -> 7.4 GB/s. It is the host's memcpy speed
more than the GPU's, so a step fed from a DataLoader with pinned memory and non_blocking copies pays less.
"""

from __future__ import annotations

PAGEABLE_H2D_BYTES_PER_S = 7.4e9


def input_copy_s(nbytes: float) -> float:
    return nbytes / PAGEABLE_H2D_BYTES_PER_S if nbytes > 0 else 0.0

