"""Runs inside every Python process that `gpuwise watch -- CMD` / `gpuwise tune -- CMD` starts.

Loaded by the generated `sitecustomize` (see `bootstrap/__init__.py`) from its file path, so it uses
only the standard library until the script itself imports torch; then, right after `import torch`
finishes, it hooks:

- `_BaseDataLoaderIter.__next__`: the wait for each batch (wall clock, and this thread's CPU demand --
  time on a core or queued for one, `/proc/thread-self/schedstat` -- when the main process loads,
  `num_workers=0`), the samples in it, and which loader it came from; with workers, their CPU demand
  every second or so (`/proc/PID/schedstat`): CPU-bound decoding is runnable all the time, I/O sleeps;
- `DataLoader.__init__`: records the loader's settings and, in a tune trial, overrides
  num_workers / pin_memory / prefetch_factor / persistent_workers (GPUWISE_LOADER_OVERRIDES, JSON);
- `Tensor.to` / `Tensor.cuda` (CUDA builds only): host-to-device copies;
- `torch.optim.optimizer.register_optimizer_step_post_hook`: a step ends at each optimizer step
  (of the first optimizer seen: a GAN's second optimizer does not split steps), plus CUDA events
  around the device work when CUDA is initialised.

DataLoader workers (forked or spawned) never record steps: records belong to the pid that installed
the hooks, and a process writes a file only when it loaded a batch, stepped an optimizer, or is not
a multiprocessing child. Records are JSON lines in the `Timeline` format (`monitoring/timeline.py`),
appended one whole line per `os.write` on an O_APPEND descriptor (a crash leaves at most a truncated
last line, which the reader skips), every `GPUWISE_HOOKS_FLUSH_S` seconds (default 1) and at exit.
Nothing here may raise into the user's script: every hook falls back to the original call.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time

ENV_DIR = "GPUWISE_HOOKS_DIR"            # where this process writes hooks-rank{R}-pid{P}.jsonl
ENV_OVERRIDES = "GPUWISE_LOADER_OVERRIDES"  # tune trials: DataLoader keyword overrides (JSON object)
ENV_FLUSH_S = "GPUWISE_HOOKS_FLUSH_S"    # seconds between appends (0: every step, as tune trials use)
OVERRIDABLE = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers")
DEMAND_EVERY = 4                         # batches between CPU-demand reads when the main process loads
WORKER_CPU_EVERY_S = 1.0                 # how often the workers' schedstat is read (cost ~10 us per worker)

_clock = time.perf_counter
_REC = None  # the _Recorder of this process, once torch is imported


def _demand_s(path: str) -> float | None:
    """Seconds a thread ran on a CPU plus waited in a run queue for one (Linux schedstat: "run_ns wait_ns
    slices", Documentation/scheduler/sched-stats.rst). A CPU-bound thread on a busy machine shares its
    core but stays runnable: run + wait ~= wall; a thread blocked on I/O sleeps, which counts in neither."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            run_ns, wait_ns = os.read(fd, 128).split()[:2]
        finally:
            os.close(fd)
        return (int(run_ns) + int(wait_ns)) / 1e9
    except (OSError, ValueError):
        return None


_SCHEDSTAT_FDS: dict[int, int | None] = {}  # native thread id -> an open /proc/self/task/TID/schedstat


def thread_demand_s() -> float:
    """This thread's CPU demand in seconds (schedstat), or its CPU time where there is no schedstat.
    The file stays open and is re-read with pread (~3 us; opening it each time costs ~20 us)."""
    import threading

    tid = threading.get_native_id()
    fd = _SCHEDSTAT_FDS.get(tid, -1)
    if fd == -1:
        try:
            fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
        except OSError:
            fd = None
        _SCHEDSTAT_FDS[tid] = fd
    if fd is not None:
        try:
            run_ns, wait_ns = os.pread(fd, 128, 0).split()[:2]
            return (int(run_ns) + int(wait_ns)) / 1e9
        except (OSError, ValueError):
            _SCHEDSTAT_FDS[tid] = None
    return time.thread_time()


def _batch_len(batch) -> int:
    """Samples in a batch: the first dimension of its first tensor (tensor, list/tuple, dict, nested once)."""
    for _ in range(3):
        shape = getattr(batch, "shape", None)
        if shape is not None:
            return int(shape[0]) if len(shape) else 1
        if isinstance(batch, dict):
            batch = next(iter(batch.values()), None)
        elif isinstance(batch, (list, tuple)):
            batch = batch[0] if batch else None
        else:
            data = getattr(batch, "data", None)  # transformers' BatchEncoding is a UserDict
            if isinstance(data, dict):
                batch = data
            else:
                return 0
    return 0


class _Recorder:
    def __init__(self, directory: str):
        self.pid = os.getpid()
        self.dir = directory
        self.rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) or 0)
        self.t0 = _clock()
        self.t0_unix = time.time()
        flush = os.environ.get(ENV_FLUSH_S, "")
        self.flush_every_s = float(flush) if flush else 1.0
        self.step_start: float | None = None
        self.data_s = self.copy_s = 0.0
        self.samples = 0
        self.copy_bytes = 0
        self.copies = self.pinned_copies = 0
        self.n_steps = 0
        self.key_opt: int | None = None
        self.others_since_key = 0
        self.loaders: list[dict] = []
        self.buffer: list[dict] = []
        self.pending: list[tuple[dict, object, object]] = []  # (record, start event, end event)
        self.last_end_event = None
        self.step_start_event = None
        self.last_flush = self.t0
        self.fd: int | None = None
        self.worker_cpu_s = 0.0      # the loader workers' CPU seconds over the sampled intervals
        self.worker_wall_s = 0.0     # worker-seconds (wall x workers) over the same intervals
        self.last_worker_read: tuple[float, float, int] | None = None
        self.notes: list[str] = []
        self.cuda = False
        self.lib = None  # torch, once hooked

    # -- the step ------------------------------------------------------------------------------------
    def on_step(self, opt) -> None:
        if os.getpid() != self.pid:
            return
        key = id(opt)
        if self.key_opt is None:
            self.key_opt = key
        elif key != self.key_opt:
            # A second optimizer in the same step (GANs) does not end a step; one that replaced the first
            # (a new optimizer object mid-run) does, once the first has stopped stepping.
            self.others_since_key += 1
            if self.others_since_key < 3:
                return
            self.key_opt = key
        self.others_since_key = 0
        now = _clock()
        start = self.step_start if self.step_start is not None else self.t0
        total = max(now - start, 0.0)
        data, copy = min(self.data_s, total), min(self.copy_s, total)
        rec = {"type": "step", "step": self.n_steps, "start_s": start - self.t0, "total_s": total, "data_s": data,
               "copy_s": copy, "compute_s": max(total - data - copy, 0.0), "rank": self.rank,
               "samples": self.samples}
        self.n_steps += 1
        self.data_s = self.copy_s = 0.0
        self.samples = 0
        self.step_start = now
        if self.cuda or self._cuda_now():
            self._cuda_events(rec)
        else:
            self.buffer.append(rec)
        if now - self.last_flush >= self.flush_every_s:
            self.flush(now)

    def _cuda_now(self) -> bool:
        torch = self.lib
        if torch is not None and torch.version.cuda and torch.cuda.is_initialized():
            self.cuda = True
        return self.cuda

    def _cuda_events(self, rec: dict) -> None:
        """Device time of the step (start event -> end event) and the device's idle gap before it."""
        torch = self.lib
        try:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            rec["memory_allocated_bytes"] = int(torch.cuda.memory_allocated())
        except Exception:  # a process whose CUDA is unusable: host clock only
            self.cuda = False
            self.buffer.append(rec)
            return
        self.pending.append((rec, self.step_start_event, self.last_end_event, end))
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
            rec, start, prev_end, end = self.pending[0]
            try:
                if wait:
                    end.synchronize()
                elif not end.query():
                    return
                if start is not None:
                    rec["gpu_s"] = start.elapsed_time(end) / 1e3
                    if prev_end is not None:
                        rec["gpu_idle_s"] = max(prev_end.elapsed_time(start) / 1e3, 0.0)
                elif prev_end is not None:
                    rec["gpu_s"] = prev_end.elapsed_time(end) / 1e3
            except Exception:
                pass
            self.pending.pop(0)
            self.buffer.append(rec)

    # -- the loader ----------------------------------------------------------------------------------
    def on_batch(self, it, t: float, wait_s: float, cpu_s: float | None, batch) -> None:
        if self.step_start is None:
            self.step_start = t
        self.data_s += wait_s
        n = _batch_len(batch)
        self.samples += n
        info = getattr(it, "_gpuwise_loader", None)
        if info is not None:
            info["batches"] += 1
            info["wait_s"] += wait_s
            if cpu_s is not None:
                info["wait_cpu_s"] += cpu_s
                info["sampled_wait_s"] += wait_s
            if n and info.get("batch_size") is None:
                info["batch_size"] = n
            workers = getattr(it, "_workers", None)
            if workers and t - (self.last_worker_read[0] if self.last_worker_read else 0.0) >= WORKER_CPU_EVERY_S:
                self._read_workers(workers, t)
        self.mark_device_start()

    def _read_workers(self, workers, t: float) -> None:
        cpu = [_demand_s(f"/proc/{w.pid}/schedstat") for w in workers]
        if any(c is None for c in cpu):
            self.last_worker_read = (t, 0.0, -1)
            return
        total = sum(cpu)
        last = self.last_worker_read
        if last is not None and last[2] == len(workers) and total >= last[1]:
            self.worker_cpu_s += total - last[1]
            self.worker_wall_s += (t - last[0]) * len(workers)
        self.last_worker_read = (t, total, len(workers))

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
        main = max(self.loaders, key=lambda d: d["batches"], default=None)
        meta = {"pid": self.pid, "rank": self.rank, "t0_unix": self.t0_unix, "source": "hooks",
                "world_size": int(os.environ.get("WORLD_SIZE", "1") or 1), "cpu_count": os.cpu_count(),
                "argv": list(sys.argv), "optimizer_steps": self.n_steps,
                "loader_batches": sum(d["batches"] for d in self.loaders), "loaders": len(self.loaders),
                "loader_wait_s": sum(d["wait_s"] for d in self.loaders),
                "framework": _framework()}
        if main is not None:
            for k in OVERRIDABLE:
                meta[f"loader_{k}"] = main.get(k)
            if main.get("batch_size"):
                meta["batch_size"] = main["batch_size"]
            busy = None
            if not main.get("num_workers") and main["sampled_wait_s"] > 0:
                busy = main["wait_cpu_s"] / main["sampled_wait_s"]  # the main thread decodes while the step waits
            elif main.get("num_workers") and self.worker_wall_s > 0:
                busy = self.worker_cpu_s / self.worker_wall_s  # each worker's share of a core
            if busy is not None:
                meta["loader_cpu_busy_fraction"] = round(min(busy, 1.0), 4)
            if main.get("overridden"):
                meta["loader_overridden"] = main["overridden"]
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
        if self.n_steps or any(d["batches"] for d in self.loaders):
            return True
        try:
            import multiprocessing

            return multiprocessing.parent_process() is None  # a spawned DataLoader worker stays silent
        except Exception:
            return True

    def _write(self, lines: list[dict]) -> None:
        if self.fd is None:
            os.makedirs(self.dir, exist_ok=True)
            path = os.path.join(self.dir, f"hooks-rank{self.rank}-pid{self.pid}.jsonl")
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
            lines = [{"type": "meta", **self.meta()}, *lines]
        if lines:  # one write: whole lines, and a crash can tear at most the last one
            os.write(self.fd, "".join(json.dumps(obj, default=str) + "\n" for obj in lines).encode())

    def flush(self, now: float | None = None) -> None:
        if os.getpid() != self.pid:
            return
        self.last_flush = _clock() if now is None else now
        if not self.buffer and self.fd is not None:
            return
        if self.fd is None and not self.worth_writing():
            return
        lines, self.buffer = self.buffer, []
        try:
            self._write(lines)
        except OSError:
            pass

    def close(self) -> None:
        if os.getpid() != self.pid:
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


# -- installing the hooks --------------------------------------------------------------------------------

def _overrides() -> dict:
    raw = os.environ.get(ENV_OVERRIDES)
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return {k: v for k, v in data.items() if k in OVERRIDABLE} if isinstance(data, dict) else {}


def apply_overrides(kwargs: dict, overrides: dict) -> dict:
    """`kwargs` (DataLoader's, bound by name) with `overrides`, kept valid: prefetch_factor and
    persistent_workers only with workers (DataLoader raises otherwise)."""
    out = dict(kwargs, **overrides)
    if not out.get("num_workers"):
        out["prefetch_factor"] = None
        out["persistent_workers"] = False
    return out


def install_torch_hooks(torch) -> None:
    """Hook the loader, copies and optimizer steps of this process (idempotent)."""
    global _REC
    if _REC is not None or getattr(torch, "_gpuwise_hooked", False):
        return
    import inspect

    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils.data import dataloader as dl

    rec = _Recorder(os.environ.get(ENV_DIR) or ".")
    rec.lib = torch
    _REC = rec
    torch._gpuwise_hooked = True
    overrides = _overrides()
    loader_init = dl.DataLoader.__init__
    signature = inspect.signature(loader_init)

    def DataLoader_init(self, *args, **kwargs):
        info = None
        try:
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            named = dict(bound.arguments)
            named.pop("self")
            extra = named.pop(next((p.name for p in signature.parameters.values() if p.kind == p.VAR_KEYWORD), ""), {})
            if overrides and os.getpid() == rec.pid:
                changed = apply_overrides(named, overrides)
                info_over = {k: changed[k] for k in OVERRIDABLE if changed.get(k) != named.get(k)}
                named = changed
            else:
                info_over = {}
            info = {k: named.get(k) for k in OVERRIDABLE}
            info.update(batches=0, wait_s=0.0, wait_cpu_s=0.0, sampled_wait_s=0.0, batch_size=None,
                        overridden=info_over)
            args, kwargs = (), {**named, **extra}
        except Exception:
            pass  # anything odd: the user's call as it was
        loader_init(self, *args, **kwargs)
        if info is not None and os.getpid() == rec.pid:
            for k in OVERRIDABLE:  # what the loader really uses (prefetch_factor None means 2 with workers)
                info[k] = getattr(self, k, info[k])
            self._gpuwise_loader = info
            rec.loaders.append(info)

    DataLoader_init.__wrapped__ = loader_init
    dl.DataLoader.__init__ = DataLoader_init

    iter_init = dl._BaseDataLoaderIter.__init__

    def iter_init_hook(self, loader, *a, **k):
        iter_init(self, loader, *a, **k)
        self._gpuwise_loader = getattr(loader, "_gpuwise_loader", None)

    dl._BaseDataLoaderIter.__init__ = iter_init_hook

    next_ = dl._BaseDataLoaderIter.__next__
    thread_time = thread_demand_s

    def next_hook(self):
        if os.getpid() != rec.pid:
            return next_(self)
        info = getattr(self, "_gpuwise_loader", None)
        # the main process loads: its CPU demand on every DEMAND_EVERY-th batch (a schedstat read is ~3 us)
        main_loads = not self._num_workers and info is not None and info["batches"] % DEMAND_EVERY == 0
        c = thread_time() if main_loads else 0.0
        t = _clock()
        batch = next_(self)  # StopIteration passes through; the end of an epoch is not a batch
        now = _clock()
        rec.on_batch(self, t, now - t, thread_time() - c if main_loads else None, batch)
        return batch

    dl._BaseDataLoaderIter.__next__ = next_hook

    if torch.version.cuda or getattr(torch.version, "hip", None):
        _hook_copies(torch, rec)

    register_optimizer_step_post_hook(lambda opt, args, kwargs: rec.on_step(opt))
    atexit.register(rec.close)


def _hook_copies(torch, rec: _Recorder) -> None:
    orig_to, orig_cuda = torch.Tensor.to, torch.Tensor.cuda

    def to(self, *args, **kwargs):
        if self.is_cuda:
            return orig_to(self, *args, **kwargs)
        t = _clock()
        out = orig_to(self, *args, **kwargs)
        if out is not self and out.is_cuda:
            rec.on_copy(_clock() - t, self, self.is_pinned())
        return out

    def cuda(self, *args, **kwargs):
        if self.is_cuda:
            return orig_cuda(self, *args, **kwargs)
        t = _clock()
        out = orig_cuda(self, *args, **kwargs)
        rec.on_copy(_clock() - t, self, self.is_pinned())
        return out

    torch.Tensor.to = to
    torch.Tensor.cuda = cuda


class _TorchFinder:
    """A meta-path finder that lets `import torch` run, then hooks torch right after it finished."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            try:
                install_torch_hooks(module)
            except Exception as exc:  # never break the user's import
                sys.stderr.write(f"gpuwise: could not instrument torch ({type(exc).__name__}: {exc})\n")

        loader.exec_module = exec_module
        return spec


def install() -> None:
    """Called from the generated sitecustomize: hook torch now if it is loaded, else when it is imported."""
    if not os.environ.get(ENV_DIR):
        return
    if "torch" in sys.modules:
        install_torch_hooks(sys.modules["torch"])
    elif not any(isinstance(f, _TorchFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchFinder())
