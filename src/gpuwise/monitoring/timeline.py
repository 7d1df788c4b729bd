"""The monitor's data model: per-step timings, periodic samples, and the run's metadata.

A `Timeline` is what the in-process monitor, the Lightning callback and `gpuwise watch` all produce;
the summary, the diagnosis rules and the reports only read it. On disk it is JSON lines (one file per
rank): a `meta` line, then `step` and `sample` lines in any order, so that a crashed run's partial file
still reads back.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

ENV_DIR = "GPUWISE_MONITOR_DIR"  # set by `gpuwise watch`: the monitor in the child writes its steps here


@dataclass(slots=True)
class StepRecord:
    """One training step: from asking for batch i to asking for batch i+1 (wall clock, seconds)."""

    step: int
    start_s: float                      # since the monitor started
    total_s: float
    data_s: float = 0.0                 # waiting for the next batch (the loader's __next__)
    copy_s: float = 0.0                 # host-to-device copy
    compute_s: float = 0.0              # the rest: forward, backward, optimizer (host wall clock)
    gpu_s: float | None = None          # CUDA events around the step's device work (GPU only)
    gpu_idle_s: float | None = None     # CUDA events: device idle between the last step's end and this one's start
    memory_allocated_bytes: int | None = None  # torch.cuda.memory_allocated at the step's end (GPU only)
    rank: int = 0  # field order is used positionally in Monitor._end_step
    samples: int | None = None          # samples loaded during the step (gpuwise.bootstrap's hooks)
    comm_s: float | None = None         # waiting on collectives (bootstrap/comm.py); not part of compute_s


@dataclass
class Sample:
    """One tick of the sampler: host CPU/RAM and, where NVML (or fake GPUs) answer, each GPU in use."""

    t_s: float
    cpu_pct: float | None = None        # whole machine
    proc_cpu_pct: float | None = None   # the monitored process (tree); 100 = one core
    rss_bytes: int | None = None        # the monitored process (tree)
    ram_used_pct: float | None = None
    gpus: dict[int, dict[str, float | None]] = field(default_factory=dict)  # NVML index -> nvml.sample()
    rank: int = 0


@dataclass
class Timeline:
    """Everything one monitored run recorded. `meta` holds what the rules need besides timings:
    device, device_name, device_total_bytes, capability, precision, tf32, loader settings, batch size,
    pinned_fraction, batch_bytes, peak memory, command, exit_code, notes."""

    steps: list[StepRecord] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # per-step estimates of |G|^2 and tr(Sigma)/batch for the gradient noise scale (gpuwise/bootstrap/noise.py):
    # {"step", "batch", "g2", "tr_b", "estimator"}; read by monitoring/noise_scale.py
    noise: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ranks(self) -> list[int]:
        return sorted({s.rank for s in self.steps})

    def to_dict(self) -> dict:
        return {"meta": self.meta, "notes": self.notes, "steps": [asdict(s) for s in self.steps],
                "samples": [_sample_dict(s) for s in self.samples], "noise": self.noise}


def _sample_dict(s: Sample) -> dict:
    d = asdict(s)
    d["gpus"] = {str(k): v for k, v in s.gpus.items()}
    return d


def sample_from_dict(d: dict) -> Sample:
    d = dict(d)
    d["gpus"] = {int(k): v for k, v in (d.get("gpus") or {}).items()}
    return Sample(**{k: v for k, v in d.items() if k in Sample.__dataclass_fields__})


def step_from_dict(d: dict) -> StepRecord:
    return StepRecord(**{k: v for k, v in d.items() if k in StepRecord.__dataclass_fields__})


def rank_file(directory: str, rank: int, part: int = 0) -> str:
    """`monitor-rank{rank}.jsonl`; a process's later monitors (one per epoch, say) add `.{part}`."""
    return os.path.join(directory, f"monitor-rank{rank}.jsonl" if part == 0 else f"monitor-rank{rank}.{part}.jsonl")


def free_rank_file(directory: str, rank: int) -> str:
    """The file this process's next monitor writes: a file left by another process (an earlier run) is
    replaced, one written by this process is kept and the next part used."""
    part = 0
    while True:
        path = rank_file(directory, rank, part)
        if not os.path.exists(path) or _file_pid(path) != os.getpid():
            return path
        part += 1


def _file_pid(path: str) -> int | None:
    try:
        with open(path) as fh:
            return json.loads(fh.readline()).get("pid")
    except (OSError, ValueError):
        return None


class TimelineWriter:
    """Appends a timeline to a JSON-lines file as it grows (called from the sampler thread, ~1 Hz)."""

    def __init__(self, path: str, meta: dict):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.path = path
        self._fh = open(path, "w")  # noqa: SIM115 - kept open for the run, closed in close()
        self._steps_done = 0
        self._samples_done = 0
        self._write({"type": "meta", **meta})

    def _write(self, obj: dict) -> None:
        self._fh.write(json.dumps(obj, default=str) + "\n")

    def flush(self, timeline: Timeline) -> None:
        steps, samples = timeline.steps, timeline.samples
        n_steps, n_samples = len(steps), len(samples)  # lists only grow; read the lengths once
        for s in steps[self._steps_done:n_steps]:
            self._write({"type": "step", **asdict(s)})
        for s in samples[self._samples_done:n_samples]:
            self._write({"type": "sample", **_sample_dict(s)})
        self._steps_done, self._samples_done = n_steps, n_samples
        self._fh.flush()

    def close(self, timeline: Timeline) -> None:
        if self._fh.closed:
            return
        self.flush(timeline)
        for row in timeline.noise:
            self._write({"type": "noise", **row})
        self._write({"type": "end", "meta": timeline.meta, "notes": timeline.notes})
        self._fh.close()


def read_timeline(path: str) -> Timeline:
    """Read one rank's file; a truncated last line (a crashed run) is skipped."""
    tl = Timeline()
    with open(path) as fh:
        for line in fh:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            kind = obj.pop("type", None)
            if kind == "meta":
                tl.meta.update(obj)
            elif kind == "step":
                tl.steps.append(step_from_dict(obj))
            elif kind == "sample":
                tl.samples.append(sample_from_dict(obj))
            elif kind == "noise":
                tl.noise.append(obj)
            elif kind == "end":
                tl.meta.update(obj.get("meta") or {})
                tl.notes.extend(n for n in obj.get("notes") or [] if n not in tl.notes)
    return tl


def merge_timelines(timelines: list[Timeline]) -> Timeline:
    """One timeline from several files: DDP ranks, or one process's successive monitors. Steps and samples
    keep their rank; times move onto the earliest file's clock (`t0_unix`); meta comes from the lowest
    rank, with `world_size` and each rank's device."""
    merged = Timeline()
    ordered = sorted(timelines, key=lambda t: (t.meta.get("rank", 0), t.meta.get("t0_unix", 0.0)))
    starts = [t.meta["t0_unix"] for t in ordered if "t0_unix" in t.meta]
    t0 = min(starts) if starts else None
    for tl in ordered:
        shift = tl.meta["t0_unix"] - t0 if t0 is not None and "t0_unix" in tl.meta else 0.0
        for st in tl.steps:
            st.start_s += shift
        for sa in tl.samples:
            sa.t_s += shift
        merged.steps.extend(tl.steps)
        merged.samples.extend(tl.samples)
        merged.notes.extend(n for n in tl.notes if n not in merged.notes)
    # DDP ranks step on the same all-reduced gradient: one process's pairs (the first that has any) say it all
    merged.noise = next((list(t.noise) for t in ordered if t.noise), [])
    if ordered:
        merged.meta = dict(ordered[0].meta)
        ranks = sorted({t.meta.get("rank", 0) for t in ordered})
        merged.meta["world_size"] = max(len(ranks), int(merged.meta.get("world_size") or 1))
        merged.meta["rank_devices"] = {str(t.meta.get("rank", 0)): t.meta.get("device") for t in ordered}
        if t0 is not None:
            merged.meta["t0_unix"] = t0
    merged.samples.sort(key=lambda s: s.t_s)
    return merged


def read_rank_files(directory: str, since_unix: float | None = None) -> Timeline | None:
    """Merge every `monitor-rank*.jsonl` in `directory`; None when there is none. With `since_unix`, files
    of monitors started before then (an earlier run's, left in a reused folder) are left out."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.startswith("monitor-rank") and n.endswith(".jsonl"))
    except OSError:
        return None
    timelines = [read_timeline(os.path.join(directory, n)) for n in names]
    if since_unix is not None:
        timelines = [t for t in timelines if t.meta.get("t0_unix", since_unix) >= since_unix]
    return merge_timelines(timelines) if timelines else None
