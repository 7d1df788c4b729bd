"""Time in collectives (communication), per step, seen without a code change in a distributed script.

Loaded by hooks.py by its file path (standard library only at import, as hooks.py); `install(torch, clock)`
runs once torch is imported and returns a `CommProbe` whose `take()` the recorder calls at each optimizer step.

What is timed is the time the training thread *waits* on communication (exposed communication), the part a
faster network or more overlap would give back:

- DDP: its reducer calls the ProcessGroup from C++ (a Python wrapper of `dist.all_reduce` never sees a
  bucket), but it calls a registered communication hook from Python. Every `DistributedDataParallel` gets one
  at construction: a timing wrapper around `default_hooks.allreduce_hook` (what the reducer does by default:
  divide by the world size, all-reduce), or around the hook the script registers later (our hook calls
  whatever `register_comm_hook` last set, so the script's own hook still runs). The reducer waits for every
  bucket's future at the end of backward; a bucket's hook is called once its gradients are ready, the last
  one when backward's compute is done. On GPUs the step's communication is `last bucket's all-reduce done -
  last bucket's hook called` (earlier buckets overlap backward's kernels); on CPU tensors (gloo) every second
  a bucket is in flight, because gloo's reductions compete with backward for the same cores (`take()`).
- Python-level collectives (FSDP2's all-gather / reduce-scatter, the script's own `dist.*` calls): each
  `torch.distributed` function in `COLLECTIVES` is wrapped: a blocking call counts whole, an `async_op=True`
  call its issue time, and `Work.wait()` (torch._C._distributed_c10d.Work, called from Python by FSDP2 and by
  scripts) the wait. Calls made by our DDP hook are not counted twice.

Also counted: bytes all-reduced by DDP per step (`bytes`), and every collective's issue-to-done time
(`busy`, overlapped or not) where a future says when it finished.
"""

from __future__ import annotations

import threading

# torch.distributed functions whose calls count (those that exist in the installed torch are wrapped)
COLLECTIVES = ("all_reduce", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single",
               "all_gather", "all_gather_into_tensor", "all_gather_single", "broadcast", "barrier",
               "all_to_all", "all_to_all_single", "reduce", "gather", "scatter")


class CommProbe:
    """Per-step communication seconds; `take()` returns (exposed_s, busy_s, bytes) since the last take."""

    def __init__(self, clock):
        self.clock = clock
        self.exposed_s = 0.0      # blocking collectives, async issue, Work.wait
        self.flights: list[list] = []  # this step's DDP buckets: [hook called, all-reduce done or None]
        self.on_cpu = True        # the buckets are CPU tensors (gloo)
        self.bytes = 0            # DDP bucket bytes
        self.calls = 0            # collectives seen (all steps): 0 means "not a distributed script"
        self.ddp_models = 0
        self.steps = 0            # takes (optimizer steps)
        self.total_bytes = 0      # DDP bucket bytes, all steps
        self.total_busy_s = 0.0
        self.local = threading.local()  # .inside: within our DDP hook (its dist.all_reduce is not counted)

    def take(self) -> tuple[float, float, int]:
        """(communication seconds of the step, DDP buckets' in-flight seconds, DDP bytes) since the last take.

        DDP on the GPU: the wait after the last bucket's hook (earlier buckets overlap backward's kernels).
        DDP on CPU tensors (gloo): every second a bucket is in flight (the union of issue -> done): gloo's
        reductions and copies run on the cores backward runs on, so its overlap with backward does not hide it
        (measured: a 17M-parameter MLP's backward at 2 samples takes 0.5-0.9 s under DDP on 2 gloo ranks of a
        2-core machine, ~0.02 s without)."""
        exposed = self.exposed_s
        busy = _union_s(self.flights)
        if self.flights:
            if self.on_cpu:
                exposed += busy
            else:
                ends = [e for _, e in self.flights if e is not None]
                if ends:
                    exposed += max(max(ends) - self.flights[-1][0], 0.0)
        out = (exposed, busy, self.bytes)
        self.steps += 1
        self.total_bytes += self.bytes
        self.total_busy_s += busy
        self.exposed_s = 0.0
        self.bytes = 0
        self.flights = []
        return out

    # -- DDP ---------------------------------------------------------------------------------------------
    def ddp_hook(self, cell: list):
        """The comm hook registered on each DDP model: times `cell[1](cell[0], bucket)` (state, hook)."""
        clock = self.clock
        local = self.local

        def timed_hook(_state, bucket):
            t = clock()
            local.inside = True
            try:
                fut = cell[1](cell[0], bucket)
            finally:
                local.inside = False
            flight = [t, None]
            self.flights.append(flight)
            self.calls += 1
            try:
                buffer = bucket.buffer()
                self.bytes += buffer.numel() * buffer.element_size()
                self.on_cpu = buffer.device.type == "cpu"
            except Exception:
                pass

            def done(f):
                flight[1] = clock()
                return f.value()

            return fut.then(done)

        return timed_hook


def _union_s(flights: list[list]) -> float:
    """Seconds covered by the [start, end] intervals (those not finished are left out)."""
    total, reach = 0.0, None
    for start, end in sorted(f for f in flights if f[1] is not None):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def parallel_meta(probe: CommProbe | None, torch) -> dict:
    """What the summary needs about this process's parallelism: its collectives, torch's intra-op threads,
    the ranks on this node and the cores it may use (oversubscription: threads x processes > cores)."""
    import os

    meta = {}
    try:
        meta["torch_threads"] = int(torch.get_num_threads())
    except Exception:
        pass
    try:
        meta["usable_cores"] = len(os.sched_getaffinity(0))
    except Exception:
        meta["usable_cores"] = os.cpu_count()
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if local and local.isdigit():
        meta["local_world_size"] = int(local)
    if os.environ.get("OMP_NUM_THREADS"):
        meta["omp_num_threads"] = os.environ["OMP_NUM_THREADS"]
    if probe is not None and probe.calls:
        meta["collectives"] = probe.calls
        meta["ddp_models"] = probe.ddp_models
        if probe.steps and probe.total_bytes:
            meta["allreduce_bytes_per_step"] = probe.total_bytes // probe.steps
            meta["allreduce_busy_s_per_step"] = probe.total_busy_s / probe.steps
    return meta


def install(torch, clock) -> tuple[CommProbe | None, list[tuple]]:
    """Wrap DDP and torch.distributed's collectives; (the probe, [(owner, name, original)] to undo)."""
    try:
        import torch.distributed as dist
        if not dist.is_available():
            return None, []
        from torch._C._distributed_c10d import Work
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel as DDP
    except Exception:
        return None, []
    probe = CommProbe(clock)
    undo: list[tuple] = []
    local = probe.local

    def blocking(fn):
        def wrapper(*args, **kwargs):
            if getattr(local, "inside", False):
                return fn(*args, **kwargs)
            local.inside = True  # a blocking collective's own Work.wait() is part of it, not counted again
            t = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                probe.exposed_s += clock() - t
                probe.calls += 1
                local.inside = False
        wrapper.__wrapped__ = fn
        wrapper.__name__ = getattr(fn, "__name__", "collective")
        wrapper.__doc__ = getattr(fn, "__doc__", None)
        return wrapper

    for name in COLLECTIVES:
        fn = getattr(dist, name, None)
        if callable(fn):
            setattr(dist, name, blocking(fn))
            undo.append((dist, name, fn))
    wait = Work.wait
    try:
        Work.wait = blocking(wait)
        undo.append((Work, "wait", wait))
    except Exception:
        pass

    init, register = DDP.__init__, DDP.register_comm_hook

    def ddp_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        try:
            cell = [getattr(self, "process_group", None), default_hooks.allreduce_hook]
            register(self, None, probe.ddp_hook(cell))
            self._gpuwise_comm_cell = cell
            probe.ddp_models += 1
        except Exception:
            pass  # a DDP that refuses hooks (e.g. already has one): untimed, as it was

    def ddp_register_comm_hook(self, state, hook):
        cell = getattr(self, "_gpuwise_comm_cell", None)
        if cell is None:
            return register(self, state, hook)
        cell[0], cell[1] = state, hook  # the script's hook runs inside our timing
        return None

    DDP.__init__ = ddp_init
    DDP.register_comm_hook = ddp_register_comm_hook
    undo += [(DDP, "__init__", init), (DDP, "register_comm_hook", register)]
    return probe, undo
