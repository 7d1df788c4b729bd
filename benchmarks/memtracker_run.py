"""The peer tool run the planner benchmarks compare with: torch's MemTracker over a step under FakeTensorMode.

Imports only torch, so a benchmark's child process can time it without gpuwise's modules.
"""

from __future__ import annotations

import torch


def memtracker_step(workload, batch_size: int) -> None:
    """Track a warm-up step (the optimizer state appears) and the steady step of `workload` with AdamW, the
    work a memory tracker needs to name a training step's peak; read the peak snapshot."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    with FakeTensorMode(allow_non_fake_inputs=True):
        model = workload.build_model()
        opt = torch.optim.AdamW(model.parameters())
        batch = workload.build_batch(batch_size)
        tracker = MemTracker()
        tracker.track_external(model, opt)
        with tracker:
            for i in range(2):  # warm-up step (optimizer state), then the steady step
                workload.compute_loss(model, batch).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if i == 0:
                    tracker.reset_mod_stats()  # MemTracker refuses a second iteration otherwise
        tracker.get_tracker_snapshot("peak")
