"""A Lightning callback running `gpuwise.monitor` around `trainer.fit`:

    from gpuwise.integrations.lightning import GpuwiseMonitor
    trainer = L.Trainer(callbacks=[GpuwiseMonitor(report="watch.html")])

A step runs from one `on_train_batch_end` to the next: the time until `on_train_batch_start` is data
wait (fetching and moving the batch), the rest compute; validation runs are left out. Under DDP every rank writes its own file into
`out_dir` (default GPUWISE_MONITOR_DIR, else ./gpuwise-monitor) and rank 0 merges them into one report
after a barrier. `lightning` is imported only here; without it the class still works duck-typed (its
hooks are plain methods), which is how the tests run it.
"""

from __future__ import annotations

import os
import time

from ..monitoring.core import Monitor
from ..monitoring.summary import summarize
from ..monitoring.timeline import ENV_DIR, read_rank_files
from ..plan.hint import planner_max_batch
from . import CallbackRun, show_run


def _callback_base():
    for mod in ("lightning.pytorch", "pytorch_lightning"):
        try:
            return __import__(mod, fromlist=["Callback"]).Callback
        except ImportError:
            continue
    return object


def lightning_precision(value) -> str | None:
    """Lightning's precision names ('32-true', 'bf16-mixed', '16-mixed', 'bf16-true') as gpuwise's."""
    text = str(value or "")
    if text.startswith("bf16"):
        return "bf16" if "mixed" in text else "bf16-pure"
    if text.startswith("16"):
        return "fp16"
    if text.startswith("32"):
        import torch

        return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"
    return None


class GpuwiseMonitor(_callback_base(), CallbackRun):
    """Per-step data-wait / compute split, sampling, findings in `result`; rank 0 hands them to `on_result`
    (`gpuwise.show_run` by default: an HTML report if `report` is set, the summary printed if
    `print_summary`)."""

    def __init__(self, report: str | None = None, out_dir: str | None = None, interval_s: float = 0.1,
                 print_summary: bool = True, on_result=None):
        super().__init__()
        self.on_result = on_result or show_run
        self._keep(report, out_dir, interval_s, print_summary)

    def _world(self, trainer) -> tuple[int, int]:
        return int(getattr(trainer, "global_rank", 0) or 0), int(getattr(trainer, "world_size", 1) or 1)

    def on_train_start(self, trainer, pl_module) -> None:
        rank, world = self._world(trainer)
        out_dir = self.out_dir or os.environ.get(ENV_DIR) or (os.path.join(os.getcwd(), "gpuwise-monitor")
                                                             if world > 1 else None)
        self._dir = out_dir
        self.monitor = Monitor(device=getattr(pl_module, "device", None), rank=rank, out_dir=out_dir,
                               precision=lightning_precision(getattr(trainer, "precision", None)),
                               interval_s=self.interval_s).start()
        loader = getattr(trainer, "train_dataloader", None)
        if loader is not None and not callable(loader):
            self.monitor.describe_loader(loader)
        self._last_end = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.monitor is None:
            return
        now = time.perf_counter()
        if self._last_end is None:
            self.monitor.begin_step()
        else:
            self.monitor.add_time("data", now - self._last_end)
        self.monitor.observe_batch(batch)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.monitor is None:
            return
        self.monitor.step()
        self._last_end = time.perf_counter()

    def on_validation_start(self, trainer, pl_module) -> None:
        """Validation (at an epoch's end, or mid-epoch with val_check_interval) is not the loader's wait:
        drop the step the last batch opened, so the next training batch starts a fresh one."""
        if self.monitor is None:
            return
        self.monitor.cancel_step()
        self._last_end = None

    def on_train_end(self, trainer, pl_module) -> None:
        if self.monitor is None:
            return
        mon, self.monitor = self.monitor, None
        mon.cancel_step()  # the step begun by the last on_train_batch_end never ran
        mon.stop()
        rank, world = self._world(trainer)
        timeline = mon.timeline
        if world > 1 and self._dir:
            strategy = getattr(trainer, "strategy", None)
            if strategy is not None and hasattr(strategy, "barrier"):
                strategy.barrier()  # every rank has closed its file
            if rank != 0:
                return
            timeline = read_rank_files(self._dir) or timeline
        self.result = summarize(timeline, planner=planner_max_batch)
        self.on_result(timeline, self.result, report=self.report, title="gpuwise monitor (Lightning)",
                       print_summary=self.print_summary and rank == 0)
