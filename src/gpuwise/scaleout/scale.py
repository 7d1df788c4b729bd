"""Measured data-parallel scaling: samples/s at 1, 2, 4... ranks with the per-rank batch held constant,
and where the time goes (compute vs gradient communication) at each size.

Method. Each rank (one CPU thread per CPU rank; one GPU per GPU rank) trains the DDP-wrapped gpuwise step on a batch already on its device (compute only,
no data loading). Steps alternate between a normal step and one inside `DDP.no_sync()`, which skips
the gradient allreduce; the per-rank medians are taken and the slowest rank counts (a synchronous step
waits for it). So per step

    compute_s        = median no_sync step (forward, backward, optimizer; no communication)
    communication_s  = median synced step - compute_s  (allreduce not hidden behind backward, plus
                       waiting for the slowest rank)

`efficiency(n) = samples_per_s(n) / (n * samples_per_s(1))`. The bus bandwidth is the allreduce's
`2 (n-1)/n * gradient bytes / communication_s` (the ring-allreduce convention of NCCL's nccl-tests,
doc/PERFORMANCE.md), a lower bound because overlapped communication is not counted.

Learning rate. With the per-rank batch B fixed the global batch is n*B, so by the linear scaling rule
the learning rate is multiplied by n, with a gradual warm-up (Goyal et al. 2017, "Accurate, Large
Minibatch SGD", §2.1-2.2). Keeping the global batch fixed instead (each rank gets B/n) keeps the
learning rate, but each rank's compute shrinks while the allreduce does not: that is why two GPUs can
be no faster than one. `fixed_global_speedup` estimates it as t(1) / (t(1)/n + communication_s(n)).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field

from ..measuring import progress
from . import backend, predict
from .job import require_result, run_job
from .train import TrainConfig, build_step, write_json_atomic

LR_RULE = ("linear scaling: global batch = nproc x per-rank batch, so multiply the 1-rank learning rate by "
           "nproc and warm it up over the first few epochs (Goyal et al. 2017, §2.1-2.2)")


@dataclass
class ScaleConfig:
    workload: str
    batch_size: int = 32              # per rank
    steps: int = 10                   # timed steps of each kind (synced and no_sync)
    warmup: int = 3
    optimizer: str | None = None
    precision: str = "fp32"
    checkpointing: bool = False
    seed: int = 0
    result_path: str | None = None
    progress_path: str | None = None  # rank 0 writes its StepProgress here (measuring/progress.py)


@dataclass
class RankTiming:
    """One world size, measured by the ranks (rank 0 reports)."""

    nproc: int
    backend: str
    device: str
    step_s: float                     # synced step, slowest rank's median
    compute_s: float                  # no_sync step, slowest rank's median
    gradient_bytes: int
    per_rank_step_s: list[float] = field(default_factory=list)

    @property
    def communication_s(self) -> float:
        return max(self.step_s - self.compute_s, 0.0)


@dataclass
class ScalePoint:
    nproc: int
    samples_per_s: float
    per_rank_samples_per_s: float
    efficiency: float
    step_s: float
    compute_s: float
    communication_s: float
    communication_fraction: float
    gradient_bytes: int
    bus_bandwidth_bytes_per_s: float | None
    fixed_global_speedup: float | None   # estimated speedup if the global batch were split instead
    predicted_efficiency: float | None = None       # scaleout/predict.py: the communication model's
    predicted_communication_s: float | None = None  # all-reduce time it assumed (the result's `link`)
    prediction_caveat: str | None = None            # "cannot tell: ..." (CPU ranks beside other load)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ScaleResult:
    workload: str
    per_rank_batch_size: int
    backend: str
    device: str
    points: list[ScalePoint]
    lr_rule: str = LR_RULE
    link: dict | None = None          # the link the prediction assumed (scaleout/predict.py)

    def to_dict(self) -> dict:
        return {"workload": self.workload, "per_rank_batch_size": self.per_rank_batch_size, "backend": self.backend,
                "device": self.device, "lr_rule": self.lr_rule, "points": [p.to_dict() for p in self.points],
                "link": self.link}


def measure_rank(cfg: ScaleConfig) -> RankTiming:
    """Runs on every rank (under torchrun): time synced and no_sync steps; rank 0 writes the result."""
    import torch

    device = backend.worker_device()
    backend_name = backend.init(device)
    rank, world = backend.rank(), backend.world_size()
    tcfg = TrainConfig(workload=cfg.workload, batch_size=cfg.batch_size, optimizer=cfg.optimizer,
                       precision=cfg.precision, checkpointing=cfg.checkpointing, seed=cfg.seed)
    workload, ts = build_step(tcfg, device)
    torch.manual_seed(cfg.seed + 1 + rank)
    batch = ts.to_device(workload.build_batch(cfg.batch_size))
    if rank == 0 and cfg.progress_path:
        progress.set_reporter(progress.file_reporter(cfg.progress_path))
    total, label = cfg.warmup + 2 * cfg.steps, f"{world} rank{'s' if world > 1 else ''}"
    for i in range(cfg.warmup):
        t = time.perf_counter()
        ts.step(batch, on_device=True)
        progress.step_done(i + 1, total, cfg.warmup, time.perf_counter() - t, label)
    synced: list[float] = []
    unsynced: list[float] = []
    for i in range(2 * cfg.steps):
        no_sync = (i % 2 == 1) if (i // 2) % 2 == 0 else (i % 2 == 0)  # ABBA order against drift
        backend.synchronize(device)
        t = time.perf_counter()
        if no_sync:
            with ts.model.no_sync():
                ts.step(batch, on_device=True)
        else:
            ts.step(batch, on_device=True)
        backend.synchronize(device)
        (unsynced if no_sync else synced).append(time.perf_counter() - t)
        progress.step_done(cfg.warmup + i + 1, total, cfg.warmup, time.perf_counter() - t, label)
    progress.set_reporter(None)
    mine = (statistics.median(synced), statistics.median(unsynced))
    everyone = backend.gather(mine)
    grad_bytes = sum(p.numel() * p.element_size() for p in ts.model.parameters() if p.requires_grad)
    timing = RankTiming(nproc=world, backend=backend_name, device=device.type,
                        step_s=max(s for s, _ in everyone), compute_s=max(c for _, c in everyone),
                        gradient_bytes=grad_bytes, per_rank_step_s=[s for s, _ in everyone])
    if rank == 0 and cfg.result_path:
        write_json_atomic(cfg.result_path, asdict(timing))
    backend.shutdown()
    return timing


def points_from(timings: list[RankTiming], per_rank_batch: int) -> list[ScalePoint]:
    """Scaling points from per-world-size timings (pure). Efficiency is against the 1-rank timing."""
    by_n = {t.nproc: t for t in timings}
    if 1 not in by_n:
        raise ValueError("scaling efficiency needs the 1-rank timing")
    one = per_rank_batch / by_n[1].step_s
    points = []
    for n in sorted(by_n):
        t = by_n[n]
        total = n * per_rank_batch / t.step_s
        comm = t.communication_s
        bus = 2 * (n - 1) / n * t.gradient_bytes / comm if n > 1 and comm > 0 else None
        fixed = by_n[1].step_s / (by_n[1].step_s / n + comm) if n > 1 else None
        points.append(ScalePoint(
            nproc=n, samples_per_s=total, per_rank_samples_per_s=per_rank_batch / t.step_s,
            efficiency=total / (n * one), step_s=t.step_s, compute_s=t.compute_s, communication_s=comm,
            communication_fraction=comm / t.step_s if t.step_s > 0 else 0.0, gradient_bytes=t.gradient_bytes,
            bus_bandwidth_bytes_per_s=bus, fixed_global_speedup=fixed))
    return points


def usable_cores() -> int:
    """CPUs this process may run on (the affinity mask, as a container or taskset sees it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def fit_cpu_ranks(nprocs: list[int], cores: int) -> tuple[list[int], list[int]]:
    """Rank counts that CPU ranks can be timed at, and the dropped ones (pure). Each gloo rank needs a core
    of its own: more ranks than cores share them, and the timing measures contention, not scaling."""
    kept = [n for n in nprocs if n <= cores]
    return kept, [n for n in nprocs if n > cores]


def measure_scaling(cfg: ScaleConfig, nprocs: list[int], *, device: str = "auto",
                    on_point=None, on_progress=None, link: str | None = None, **launch_kwargs) -> ScaleResult:
    """Launch one torchrun job per world size in `nprocs` (1 is added if missing) and compare them.

    `on_progress(StepProgress)`: rank 0's steps (label "N ranks"), polled about twice a second."""
    sizes = sorted(set(nprocs) | {1})
    # CPU ranks: one thread each at every size, so a rank has the same resources at 1 and at n ranks
    # (like one GPU per rank); a 1-rank job with all cores would not be the 1-GPU reference.
    extra_env = {} if "OMP_NUM_THREADS" in os.environ else {"OMP_NUM_THREADS": "1"}
    host = predict.host_now(int(os.environ.get("OMP_NUM_THREADS", extra_env.get("OMP_NUM_THREADS", "1")) or 1))
    timings = []
    for n in sizes:
        with _polling(cfg, on_progress):
            outcome = run_job("scale", cfg, nproc=n, device=device, extra_env=extra_env, **launch_kwargs)
        timing = RankTiming(**require_result(outcome, f"scale -n {n}"))
        timings.append(timing)
        if on_point is not None:
            on_point(timing)
    result = ScaleResult(cfg.workload, cfg.batch_size, timings[-1].backend, timings[-1].device,
                         points_from(timings, cfg.batch_size))
    predict.attach(result, link, host, measure_link=True)  # the model's efficiency next to the measured one
    return result


class _polling:
    """While a job runs: give it a progress file and pass each new state to `on_progress` (a thread)."""

    def __init__(self, cfg: ScaleConfig, on_progress, interval_s: float = 0.5):
        self.cfg, self.on_progress, self.interval_s = cfg, on_progress, interval_s
        self.stop = threading.Event()

    def __enter__(self):
        if self.on_progress is None:
            return self
        self.tmp = tempfile.TemporaryDirectory(prefix="gpuwise-progress-")
        self.cfg.progress_path = os.path.join(self.tmp.name, "progress.json")
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self) -> None:
        last = None
        while True:
            stopping = self.stop.wait(self.interval_s)
            p = progress.read_file(self.cfg.progress_path)
            if p is not None and p != last:  # the job's last state too: a run shorter than one interval
                last = p                     # still reports its steps
                self.on_progress(p)
            if stopping:
                return

    def __exit__(self, *exc) -> None:
        if self.on_progress is None:
            return
        self.stop.set()
        self.thread.join()
        self.cfg.progress_path = None
        self.tmp.cleanup()
