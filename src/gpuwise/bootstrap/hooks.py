"""Runs inside every Python process that `gpuwise watch -- CMD` / `gpuwise tune -- CMD` starts.

Loaded by the generated `sitecustomize` (see `bootstrap/__init__.py`) from its file path, so it uses
only the standard library until the script itself imports torch; then, right after `import torch`
finishes, it hooks:

- `_BaseDataLoaderIter.__next__`: the wait for each batch (wall clock; when the main process loads,
  `num_workers=0`, also this thread's CPU demand -- time on a core or queued for one,
  `/proc/thread-self/schedstat` -- around one batch every `DEMAND_EVERY_S`), the samples in it, and which
  loader it came from; with workers, their CPU demand every second or so (`/proc/PID/schedstat`):
  CPU-bound decoding is runnable all the time, I/O sleeps;
- `DataLoader.__init__`: records the loader's settings and, in a tune trial, overrides
  num_workers / pin_memory / prefetch_factor / persistent_workers (GPUWISE_LOADER_OVERRIDES, JSON);
- `Tensor.to` / `Tensor.cuda` (CUDA builds only): host-to-device copies;
- `torch.optim.optimizer.register_optimizer_step_pre_hook`: the gradients of pairs of consecutive steps,
  for the gradient noise scale (`noise.py`);
- `torch.optim.optimizer.register_optimizer_step_post_hook`: a step ends at each optimizer step
  (of the first optimizer seen: a GAN's second optimizer does not split steps), plus CUDA events
  around the device work when CUDA is initialised.

DataLoader workers (forked or spawned) never record steps: records belong to the process that installed
the hooks (a forked child puts the original functions back, `os.register_at_fork`), and a process writes
a file only when it loaded a batch, stepped an optimizer, or is not a multiprocessing child. Records are JSON lines in the
`Timeline` format (`monitoring/timeline.py`), appended one whole line per `os.write` on an O_APPEND
descriptor (a crash leaves at most a truncated last line, which the reader skips), every
`GPUWISE_HOOKS_FLUSH_S` seconds (default 1) and at exit. Nothing here may raise into the user's script:
every hook falls back to the original call. What the hooks record, and the file, are `recorder.py`'s;
the per-batch probes are `probes.py`'s (both loaded the way this file is). Their cost per step is
measured by `benchmarks/hooks_overhead.py`.
"""

from __future__ import annotations

import json
import os
import sys


def _sibling(name: str):
    """The module in `NAME.py` next to this file, loaded by its path as `_gpuwise_NAME` (once per process),
    as the generated sitecustomize loads this file: standard library only, nothing of gpuwise runs."""
    import importlib.util

    full = f"_gpuwise_{name}"
    if full not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            full, os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
    return sys.modules[full]


_probes = _sibling("probes")
_recorder = _sibling("recorder")
_noise = _sibling("noise")
_comm = _sibling("comm")

ENV_DIR = "GPUWISE_HOOKS_DIR"            # where this process writes hooks-rank{R}-pid{P}.jsonl
ENV_OVERRIDES = "GPUWISE_LOADER_OVERRIDES"  # tune trials: DataLoader keyword overrides (JSON object)
ENV_FLUSH_S = _recorder.ENV_FLUSH_S      # seconds between appends (0: every step, as tune trials use)
OVERRIDABLE = _recorder.OVERRIDABLE
thread_demand_s = _probes.thread_demand_s
_batch_len = _probes.batch_len
_clock = _recorder.clock

_REC = None  # the Recorder of this process, once torch is imported


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
    import atexit
    import inspect

    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils.data import dataloader as dl

    rec = _recorder.Recorder(os.environ.get(ENV_DIR) or ".")
    rec.lib = torch
    rec.cuda_build = bool(torch.version.cuda or getattr(torch.version, "hip", None))
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
            if overrides:
                changed = apply_overrides(named, overrides)
                info_over = {k: changed[k] for k in OVERRIDABLE if changed.get(k) != named.get(k)}
                named = changed
            else:
                info_over = {}
            info = _probes.LoaderInfo({k: named.get(k) for k in OVERRIDABLE}, info_over)
            args, kwargs = (), {**named, **extra}
        except Exception:
            pass  # anything odd: the user's call as it was
        loader_init(self, *args, **kwargs)
        if info is not None:
            for k in OVERRIDABLE:  # what the loader really uses (prefetch_factor None means 2 with workers)
                info.settings[k] = getattr(self, k, info.settings[k])
            self._gpuwise_loader = info
            rec.loaders.append(info)

    DataLoader_init.__wrapped__ = loader_init
    dl.DataLoader.__init__ = DataLoader_init

    iter_init = dl._BaseDataLoaderIter.__init__
    untracked = _probes.LoaderInfo({}, {})  # the info of loaders made before the hooks (counted nowhere)

    def iter_init_hook(self, loader, *a, **k):
        iter_init(self, loader, *a, **k)
        self._gpuwise_loader = getattr(loader, "_gpuwise_loader", untracked)

    dl._BaseDataLoaderIter.__init__ = iter_init_hook
    dl._BaseDataLoaderIter._gpuwise_loader = untracked  # iterators made before the hooks

    next_ = dl._BaseDataLoaderIter.__next__
    clock = _clock
    demand_s = _probes.demand_s
    DEMAND_EVERY_S = _probes.DEMAND_EVERY_S
    WORKER_CPU_EVERY_S = _recorder.WORKER_CPU_EVERY_S

    def next_hook(self):
        # Every batch takes this path: its cost per step is a few dozen bytecodes, each of which costs tens of
        # ns amid the loader's own code (benchmarks/hooks_overhead.py). The rest is in probed_next.
        t = clock()
        if t >= rec.probe_at:
            return probed_next(self, t)
        batch = next_(self)  # StopIteration passes through; the end of an epoch is not a batch
        rec.data_s += clock() - t
        info = self._gpuwise_loader
        info.batches += 1
        try:
            rec.samples += info.first(batch).shape[0]
        except Exception:  # a batch unlike the loader's first ones
            rec.samples += info.samples(batch)
        if rec.cuda:
            rec.mark_device_start()
        return batch

    def probed_next(self, t: float):
        """A batch at a probe time (the first one, then every DEMAND_EVERY_S): the main thread's CPU demand
        while it loads it (num_workers=0), or the workers' CPU demand (every WORKER_CPU_EVERY_S)."""
        workers = self._num_workers
        if not workers:
            c = thread_demand_s()
            t = clock()
        batch = next_(self)
        now = clock()
        wait_s = now - t
        info = self._gpuwise_loader
        if not workers:
            info.wait_cpu_s += thread_demand_s() - c
            info.sampled_wait_s += wait_s
            rec.probe_at = now + DEMAND_EVERY_S
        else:
            procs = getattr(self, "_workers", None)
            if procs:
                rec.read_workers([demand_s(f"/proc/{w.pid}/schedstat") for w in procs], t)
            rec.probe_at = now + WORKER_CPU_EVERY_S
        if rec.step_start is None:  # the first batch: the first step starts here (not at `import torch`)
            rec.step_start = t
        rec.data_s += wait_s
        info.batches += 1
        rec.samples += info.samples(batch)
        if rec.cuda:
            rec.mark_device_start()
        return batch

    dl._BaseDataLoaderIter.__next__ = next_hook

    hooked = [(dl.DataLoader, "__init__", loader_init), (dl._BaseDataLoaderIter, "__init__", iter_init),
              (dl._BaseDataLoaderIter, "__next__", next_)]
    if rec.cuda_build:
        hooked += _hook_copies(torch, rec)
    handle = register_optimizer_step_post_hook(rec.on_step)
    rec.noise, noise_handle = _noise.install(torch, lambda: rec.samples)
    rec.comm, comm_hooked = _comm.install(torch, _clock)
    rec.parallel_meta = _comm.parallel_meta
    hooked += comm_hooked

    def unhook_forked_child():
        """A forked process (a DataLoader worker) records nothing: the originals back, so that no hook has to
        ask on every call which process it runs in."""
        rec.forked()
        for owner, name, original in hooked:
            setattr(owner, name, original)
        handle.remove()
        if noise_handle is not None:
            noise_handle.remove()

    os.register_at_fork(after_in_child=unhook_forked_child)
    atexit.register(rec.close)


def _hook_copies(torch, rec) -> list[tuple]:
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
    return [(torch.Tensor, "to", orig_to), (torch.Tensor, "cuda", orig_cuda)]


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
