"""What the bootstrap's hooks (hooks.py) record in one process, and the file they leave.

Like hooks.py this uses only the standard library (nothing of gpuwise, no torch): hooks.py loads it by
its file path, as `_gpuwise_recorder`.

Cost per step (benchmarks/hooks_overhead.py) is what this module is shaped by: a step appends one tuple
(formatted as a JSON line only when the buffer is written, every `GPUWISE_HOOKS_FLUSH_S` seconds), the
per-batch bookkeeping updates a `LoaderInfo`'s slots, a batch's size is read along the path to its first
tensor found on the loader's first batch, and the main thread's CPU demand (two /proc reads, ~5 us) is
read around one batch every `probes.DEMAND_EVERY_S` rather than around every few batches.
"""

from __future__ import annotations

import json
import operator
import os
import sys
import time

ENV_FLUSH_S = "GPUWISE_HOOKS_FLUSH_S"    # seconds between appends (0: every step, as tune trials use)
OVERRIDABLE = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers")
WORKER_CPU_EVERY_S = 1.0                 # how often the workers' schedstat is read (cost ~10 us per worker)

clock = time.perf_counter

# One step line (the `Timeline` step record; keys in the order json.dumps wrote them before), seconds to
# the nanosecond (perf_counter's resolution): "%.9f" costs a third of json.dumps's shortest float repr,
# and `map(line.__mod__, rows)` formats a second's rows without a Python loop. RANK: the process's rank.
_STEP_LINE = ('{"type": "step", "step": %d, "start_s": %.9f, "total_s": %.9f, "data_s": %.9f, "copy_s": %.9f, '
              '"compute_s": %.9f, "rank": RANK, "samples": %d, "comm_s": %.9f}\n')


_WAIT = operator.itemgetter(3)  # a row's data_s
# One pair of consecutive steps' gradients (noise.py): `Timeline.noise` records.
_NOISE_LINE = '{"type": "noise", "step": %d, "batch": %d, "g2": %r, "tr_b": %r, "estimator": "%s"}\n'


def _clamped(row: tuple) -> tuple:
    """A step row whose data / copy time exceeds the step (waits timed in another thread): each part at most
    the step, compute what is left."""
    step, start_s, total, data, copy, _, samples, comm = row
    total = max(total, 0.0)
    data, copy = min(data, total), min(copy, total)
    comm = min(comm, max(total - data - copy, 0.0))
    return step, start_s, total, data, copy, max(total - data - copy - comm, 0.0), samples, comm


class Recorder:
    def __init__(self, directory: str):
        self.pid = os.getpid()
        self.child = False  # set in a process forked from this one (os.register_at_fork): it records nothing
        self.dir = directory
        self.rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) or 0)
        self.t0 = clock()
        self.t0_unix = time.time()
        flush = os.environ.get(ENV_FLUSH_S, "")
        self.flush_every_s = float(flush) if flush else 1.0
        self.flush_at = self.t0 + self.flush_every_s
        self.step_start: float | None = None
        self.data_s = self.copy_s = 0.0
        self.samples = 0
        self.copy_bytes = 0
        self.copies = self.pinned_copies = 0
        self.n_steps = 0
        self.key_opt: int | None = None
        self.others_since_key = 0   # steps of other optimizers since the counted one stepped ...
        self.others_at = -1         # ... at its n_steps-th step
        self.probe_at = 0.0   # perf_counter time after which the next batch reads CPU demand (probed_next)
        self.waited_s = 0.0   # the data wait of the steps written so far
        self.loaders: list = []  # probes.LoaderInfo, one per DataLoader
        self.step_line = _STEP_LINE.replace("RANK", str(self.rank))
        self.step_open = self.step_line[:-2]  # without "}\n": a CUDA step's fields follow
        self.buffer: list = []  # a row per step (see on_step), or its line once its CUDA events are read
        self.mixed = False      # some of the buffer is lines
        self.pending: list[tuple] = []  # (row, CUDA fields, start event, previous end event, end event)
        self.last_end_event = None
        self.step_start_event = None
        self.fd: int | None = None
        self.worker_cpu_s = 0.0      # the loader workers' CPU seconds over the sampled intervals
        self.worker_wall_s = 0.0     # worker-seconds (wall x workers) over the same intervals
        self.last_worker_read: tuple[float, float, int] | None = None
        self.notes: list[str] = []
        self.cuda_build = False  # torch was built with CUDA / ROCm (set by hooks.py)
        self.cuda = False        # ... and this process has initialised it
        self.lib = None  # torch, once hooked
        self.noise = None  # noise.NoiseProbe, once hooked: its pairs are written with the steps
        self.comm = None   # comm.CommProbe, once hooked: each step's exposed communication (comm_s)
        self.parallel_meta = None  # comm.parallel_meta, set by hooks.py

    def forked(self) -> None:
        """In a process forked from this one (os.register_at_fork): record and write nothing."""
        self.child = True

    # -- the step ------------------------------------------------------------------------------------
    def on_step(self, opt, args=None, kwargs=None) -> None:
        """torch's optimizer step post-hook: a step ends here (a forked child removes the hook)."""
        if id(opt) != self.key_opt and not self._new_key(id(opt)):
            return
        now = clock()
        start = self.step_start
        if start is None:
            start = self.t0
        total = now - start
        data, copy = self.data_s, self.copy_s
        comm = self.comm.take()[0] if self.comm is not None else 0.0
        compute = total - data - copy - comm
        # the row as its line's values: (step, start_s, total_s, data_s, copy_s, compute_s, samples, comm_s)
        row = (self.n_steps, start - self.t0, total, data, copy, compute, self.samples, comm)
        if compute < 0.0:
            row = _clamped(row)
        self.n_steps += 1
        self.data_s = self.copy_s = 0.0
        self.samples = 0
        self.step_start = now
        if self.cuda_build and (self.cuda or self._cuda_now()):
            self._cuda_events(row)
        else:
            self.buffer.append(row)
        if now >= self.flush_at:
            self.flush(now)

    def _new_key(self, key: int) -> bool:
        """Whether an optimizer other than the one whose steps count ends a step: a second optimizer in the
        same step (GANs) does not; one that replaced the first (a new optimizer object mid-run) does, once
        the first has stopped stepping."""
        if self.key_opt is not None:
            if self.others_at != self.n_steps:  # the counted optimizer stepped since: count afresh
                self.others_at, self.others_since_key = self.n_steps, 0
            self.others_since_key += 1
            if self.others_since_key < 3:
                return False
        self.key_opt = key
        self.others_since_key = 0
        return True

    def _cuda_now(self) -> bool:
        torch = self.lib
        if torch is not None and torch.cuda.is_initialized():
            self.cuda = True
        return self.cuda

    def _cuda_events(self, row: tuple) -> None:
        """Device time of the step (start event -> end event) and the device's idle gap before it."""
        torch = self.lib
        try:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            extra = {"memory_allocated_bytes": int(torch.cuda.memory_allocated())}
        except Exception:  # a process whose CUDA is unusable: host clock only
            self.cuda = self.cuda_build = False
            self.buffer.append(row)
            return
        self.pending.append((row, extra, self.step_start_event, self.last_end_event, end))
        self.step_start_event = None
        self.last_end_event = end
        self._resolve(wait=False)

    def mark_device_start(self) -> None:
        """After the wait for a step's first batch: the device work of this step starts here."""
        if self.step_start_event is None and self.cuda:
            try:
                ev = self.lib.cuda.Event(enable_timing=True)
                ev.record()
                self.step_start_event = ev
            except Exception:
                pass

    def _resolve(self, wait: bool) -> None:
        while self.pending:
            row, extra, start, prev_end, end = self.pending[0]
            try:
                if wait:
                    end.synchronize()
                elif not end.query():
                    return
                if start is not None:
                    extra["gpu_s"] = start.elapsed_time(end) / 1e3
                    if prev_end is not None:
                        extra["gpu_idle_s"] = max(prev_end.elapsed_time(start) / 1e3, 0.0)
                elif prev_end is not None:
                    extra["gpu_s"] = prev_end.elapsed_time(end) / 1e3
            except Exception:
                pass
            self.pending.pop(0)
            self.waited_s += row[3]
            self.buffer.append(self.step_open % row + ", " + json.dumps(extra, default=str)[1:-1] + "}\n")
            self.mixed = True

    # -- the loader ----------------------------------------------------------------------------------
    def read_workers(self, cpu: list[float | None], t: float) -> None:
        """The loader workers' CPU demand (`probes.demand_s` of each) read at `t`."""
        if any(c is None for c in cpu):
            self.last_worker_read = (t, 0.0, -1)
            return
        total = sum(cpu)
        last = self.last_worker_read
        if last is not None and last[2] == len(cpu) and total >= last[1]:
            self.worker_cpu_s += total - last[1]
            self.worker_wall_s += (t - last[0]) * len(cpu)
        self.last_worker_read = (t, total, len(cpu))

    def on_copy(self, seconds: float, tensor, pinned: bool) -> None:
        self.copy_s += seconds
        self.copies += 1
        self.pinned_copies += pinned
        try:
            self.copy_bytes += tensor.numel() * tensor.element_size()
        except Exception:
            pass

    # -- output --------------------------------------------------------------------------------------
    def meta(self) -> dict:
        main = max(self.loaders, key=lambda d: d.batches, default=None)
        meta = {"pid": self.pid, "rank": self.rank, "t0_unix": self.t0_unix, "source": "hooks",
                "world_size": int(os.environ.get("WORLD_SIZE", "1") or 1), "cpu_count": os.cpu_count(),
                "argv": list(sys.argv), "optimizer_steps": self.n_steps,
                "loader_batches": sum(d.batches for d in self.loaders), "loaders": len(self.loaders),
                "loader_wait_s": self.waited_s + self.data_s,
                **(self.parallel_meta(self.comm, self.lib) if self.parallel_meta and self.lib else {}),
                "framework": _framework()}
        if self.noise is not None and self.noise.opt_name:
            meta["optimizer"] = self.noise.opt_name
        if main is not None:
            for k in OVERRIDABLE:
                meta[f"loader_{k}"] = main.settings.get(k)
            if main.batch_size:
                meta["batch_size"] = main.batch_size
            busy = None
            workers = main.settings.get("num_workers")
            if not workers and main.sampled_wait_s > 0:
                busy = main.wait_cpu_s / main.sampled_wait_s  # the main thread decodes while the step waits
            elif workers and self.worker_wall_s > 0:
                busy = self.worker_cpu_s / self.worker_wall_s  # each worker's share of a core
            if busy is not None:
                meta["loader_cpu_busy_fraction"] = round(min(busy, 1.0), 4)
            if main.overridden:
                meta["loader_overridden"] = main.overridden
        torch = self.lib
        if self.cuda and torch is not None:
            try:
                meta["device"] = f"cuda:{torch.cuda.current_device()}"
                meta["device_name"] = torch.cuda.get_device_name()
                props = torch.cuda.get_device_properties(torch.cuda.current_device())
                meta["device_total_bytes"] = int(props.total_memory)
                meta["capability"] = [props.major, props.minor]
                meta["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
                meta["peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved())
            except Exception:
                pass
        else:
            meta["device"] = "cpu"
        if self.copies:
            meta["pinned_fraction"] = self.pinned_copies / self.copies
            meta["batch_bytes"] = self.copy_bytes // max(self.n_steps, 1)
        return meta

    def worth_writing(self) -> bool:
        if self.n_steps or any(d.batches for d in self.loaders):
            return True
        try:
            import multiprocessing

            return multiprocessing.parent_process() is None  # a spawned DataLoader worker stays silent
        except Exception:
            return True

    def step_lines(self, rows: list) -> str:
        """Buffered steps as JSON lines (`Timeline` step records): rows, and lines already made (CUDA's)."""
        if not self.mixed:
            return "".join(map(self.step_line.__mod__, rows))
        return "".join(r if type(r) is str else self.step_line % r for r in rows)

    def _write(self, rows: list[tuple]) -> None:
        head = ""
        if self.fd is None:
            os.makedirs(self.dir, exist_ok=True)
            path = os.path.join(self.dir, f"hooks-rank{self.rank}-pid{self.pid}.jsonl")
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
            head = json.dumps({"type": "meta", **self.meta()}, default=str) + "\n"
        text = head + self.step_lines(rows)
        if self.noise is not None:
            text += "".join(map(_NOISE_LINE.__mod__, self.noise.rows()))
        if text:  # one write: whole lines, and a crash can tear at most the last one
            os.write(self.fd, text.encode())

    def flush(self, now: float | None = None) -> None:
        if self.child:
            return
        self.flush_at = (clock() if now is None else now) + self.flush_every_s
        if not self.buffer and self.fd is not None and not (self.noise and self.noise.pending):
            return
        if self.fd is None and not self.worth_writing():
            return
        rows, self.buffer = self.buffer, []
        try:
            self.waited_s += sum(r[3] for r in rows if type(r) is tuple) if self.mixed else sum(map(_WAIT, rows))
            self._write(rows)
        except Exception:  # never into the user's script (a full disk, an odd batch size)
            pass

    def close(self) -> None:
        if self.child:
            return
        if self.pending:
            self._resolve(wait=True)
        self.flush()
        if self.fd is not None:
            try:
                os.write(self.fd, (json.dumps({"type": "end", "meta": self.meta(), "notes": self.notes},
                                              default=str) + "\n").encode())
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None


def _framework() -> str | None:
    mods = sys.modules
    if "lightning" in mods or "pytorch_lightning" in mods:
        return "lightning"
    if "transformers.trainer" in mods:
        return "transformers"
    if "accelerate" in mods:
        return "accelerate"
    return None
