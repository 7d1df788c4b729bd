"""An HF `transformers.TrainerCallback` running `gpuwise.monitor` around `Trainer.train()`:

    from gpuwise.integrations.hf import GpuwiseCallback
    Trainer(model=model, args=args, train_dataset=ds, callbacks=[GpuwiseCallback(report="watch.html")]).train()

A step runs from one `on_step_end` to the next: the time until `on_step_begin` is data wait (the Trainer
fetches the step's batches, all its gradient-accumulation micro-batches, before `on_step_begin`), the
rest is compute. Evaluation and checkpoint saving between steps are left out (`on_evaluate` / `on_save`
drop the open step). Without gpuwise in the script, `gpuwise watch -- python train.py` gives the same
split through its bootstrap. Under DDP every rank writes its own file into `out_dir` (default
GPUWISE_MONITOR_DIR); the process with `state.is_world_process_zero` summarises.
"""

from __future__ import annotations

import os
import time

from ..monitoring.core import Monitor
from ..monitoring.summary import summarize
from ..monitoring.timeline import ENV_DIR
from ..plan.hint import planner_max_batch
from . import CallbackRun, show_run


def _callback_base():
    try:
        from transformers import TrainerCallback

        return TrainerCallback
    except ImportError:  # duck-typed without transformers: the hooks are plain methods
        return object


def hf_precision(args) -> str | None:
    if getattr(args, "bf16", False):
        return "bf16"
    if getattr(args, "fp16", False):
        return "fp16"
    return None  # fp32 or tf32: the monitor looks at autocast and TF32 itself on a GPU


class GpuwiseCallback(_callback_base(), CallbackRun):
    """Per-step data-wait / compute split, sampling and findings for `transformers.Trainer`."""

    def __init__(self, report: str | None = None, out_dir: str | None = None, interval_s: float = 0.1,
                 print_summary: bool = True):
        super().__init__()
        self._keep(report, out_dir, interval_s, print_summary)

    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        rank = int(getattr(args, "process_index", 0) or 0)
        device = getattr(args, "device", None)
        batch = getattr(args, "per_device_train_batch_size", None)
        accumulation = int(getattr(args, "gradient_accumulation_steps", 1) or 1)
        self.monitor = Monitor(device=device, rank=rank, out_dir=self.out_dir or os.environ.get(ENV_DIR),
                               precision=hf_precision(args), interval_s=self.interval_s,
                               batch_size=batch * accumulation if batch else None).start()
        if train_dataloader is not None:
            self.monitor.describe_loader(train_dataloader)
        self.monitor.timeline.meta["framework"] = "transformers"
        self._last_end = None

    def on_step_begin(self, args, state, control, **kwargs):
        if self.monitor is None:
            return
        now = time.perf_counter()
        if self._last_end is None:  # the first step, or the first after an evaluation: its fetch is not timed
            self.monitor.begin_step()
        else:
            self.monitor.add_time("data", now - self._last_end)

    def on_step_end(self, args, state, control, **kwargs):
        if self.monitor is None:
            return
        self.monitor.step()
        self._last_end = time.perf_counter()

    def _pause(self) -> None:
        if self.monitor is not None:
            self.monitor.cancel_step()  # evaluation / saving between steps is not the loader's wait
            self._last_end = None

    def on_evaluate(self, args, state, control, **kwargs):
        self._pause()

    def on_save(self, args, state, control, **kwargs):
        self._pause()

    def on_train_end(self, args, state, control, **kwargs):
        if self.monitor is None:
            return
        mon, self.monitor = self.monitor, None
        mon.cancel_step()  # the step begun by the last on_step_end never ran
        mon.stop()
        self.result = summarize(mon.timeline, planner=planner_max_batch)
        if not getattr(state, "is_world_process_zero", True):
            return
        show_run(mon.timeline, self.result, report=self.report, title="gpuwise monitor (HF Trainer)",
                 print_summary=self.print_summary)
