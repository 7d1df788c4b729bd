"""The external monitor behind `gpuwise watch -- CMD`: run a command, sample its process tree and GPUs.

GPUs are attributed to the command by matching NVML's (or the fake file's) process pids against the
command's process tree (psutil), re-scanned every second; when no pid matches (a container whose pid
namespace NVML does not share) the numeric CUDA_VISIBLE_DEVICES of the command is used. If the
command runs `gpuwise.monitor`, it finds GPUWISE_MONITOR_DIR set and writes its per-step timing there
(a file per rank); those files are merged into the result, so the report has the step-time split.
Ctrl-C: the command gets SIGINT (from the terminal, or forwarded after a second), then SIGTERM after
`grace_s`, then SIGKILL; the result is still returned so the report is still written.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

from ..bootstrap import environment
from ..errors import GpuwiseError
from ..process import shell_exit_code
from .hookfiles import hook_diagnosis, read_hook_files
from .sampler import Sampler, default_gpu_source, gpus_of_pids, process_tree
from .summary import MaxBatchPlanner, summarize
from .timeline import ENV_DIR, Timeline, read_rank_files


@dataclass
class WatchResult:
    exit_code: int
    timeline: Timeline
    interrupted: bool = False
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def summary(self, planner: MaxBatchPlanner | None = None) -> dict:
        """The monitor summary of the watched command; `planner`: see `summarize`."""
        return summarize(self.timeline, planner=planner)


def _visible_indices(env: dict) -> list[int]:
    values = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return [int(v) for v in values] if values and all(v.isdigit() for v in values) else []


class _CtrlC:
    """Counts SIGINTs from before the command starts until it has ended, instead of raising
    KeyboardInterrupt wherever the main thread happens to be (inside Popen, or before the wait loop, a
    Ctrl-C would otherwise end `watch` without its report and leave the command running). Outside the
    main thread signals cannot be caught: `count` then stays 0 and a KeyboardInterrupt is handled by
    `_wait` as before."""

    def __init__(self):
        self.count = 0
        self._old = None

    def __enter__(self) -> _CtrlC:
        try:
            self._old = signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:  # not the main thread
            self._old = None
        return self

    def _on_sigint(self, signum, frame) -> None:
        self.count += 1

    def __exit__(self, *exc) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


POLL_S = 0.1  # how often the wait loop looks at the Ctrl-C count (the command's exit ends the wait at once)


def _wait(proc: subprocess.Popen, grace_s: float, ctrl_c: _CtrlC | None = None) -> bool:
    """Wait for the command; on Ctrl-C escalate SIGINT -> SIGTERM -> SIGKILL. True if interrupted.

    Stage 1 (the first Ctrl-C) gives the command a second to stop by itself (a terminal's Ctrl-C reached
    it too); then SIGINT is forwarded (stage 2), then SIGTERM and SIGKILL `grace_s` apart. A second
    Ctrl-C skips the patience."""
    ctrl_c = ctrl_c or _CtrlC()
    interrupted = False
    stage = seen = 0
    deadline = None
    while True:
        try:
            timeout = POLL_S if deadline is None else min(POLL_S, max(deadline - time.monotonic(), 0.01))
            proc.wait(timeout=timeout)
            return interrupted
        except KeyboardInterrupt:  # SIGINT not caught by _CtrlC (not the main thread)
            ctrl_c.count += 1
        except subprocess.TimeoutExpired:
            pass
        if ctrl_c.count > seen:
            seen = ctrl_c.count
            interrupted = True
            stage += 1
            deadline = time.monotonic() + (1.0 if stage == 1 else grace_s)
            if stage >= 2:  # a second Ctrl-C: no more patience
                _escalate(proc, stage)
        elif deadline is not None and time.monotonic() >= deadline:
            stage += 1
            _escalate(proc, stage)
            deadline = time.monotonic() + grace_s


def _escalate(proc: subprocess.Popen, stage: int) -> None:
    sig = {2: signal.SIGINT, 3: signal.SIGTERM}.get(stage, signal.SIGKILL)
    try:
        proc.send_signal(sig)
    except ProcessLookupError:
        pass


def watch_command(cmd: list[str], interval_s: float = 0.1, steps_dir: str | None = None, env: dict | None = None,
                  stdout=None, grace_s: float = 10.0, instrument: bool = True) -> WatchResult:
    """Run `cmd` to completion (or Ctrl-C) while sampling it; return its exit code and the timeline.

    With `instrument` (the default) every Python process of the command gets gpuwise's bootstrap
    (`gpuwise.bootstrap`): its DataLoader waits, copies and optimizer steps make the per-step split
    without a change to the script."""
    if not cmd:
        raise GpuwiseError("no command given: use `gpuwise watch -- python train.py ...`")
    if interval_s <= 0:
        raise GpuwiseError(f"--interval must be positive, got {interval_s}")
    own_dir = steps_dir is None
    directory = tempfile.mkdtemp(prefix="gpuwise-watch-") if own_dir else steps_dir
    os.makedirs(directory, exist_ok=True)
    env = dict(os.environ if env is None else env, **{ENV_DIR: directory})
    if instrument:
        env = environment(directory, env)
    timeline = Timeline(meta={"command": list(cmd), "cpu_count": os.cpu_count()})
    source, note = default_gpu_source()
    if note:
        timeline.notes.append(note)
    fallback = _visible_indices(env)
    t0 = time.perf_counter()
    timeline.meta["t0_unix"] = time.time()  # the samples' clock starts here (after NVML's start-up), the steps' too
    with _CtrlC() as ctrl_c:  # from before the command starts: a Ctrl-C at any moment stops it cleanly
        try:
            proc = subprocess.Popen(cmd, env=env, stdout=stdout)
        except OSError as exc:
            if own_dir:
                shutil.rmtree(directory, ignore_errors=True)
            raise GpuwiseError(f"cannot start {cmd[0]!r}: {exc.strerror or exc}") from exc
        errors, interrupted = _sample_until_done(proc, timeline, interval_s, source, fallback, t0, grace_s, ctrl_c)
    seconds = time.perf_counter() - t0
    timeline.notes.extend(f"sampler error: {e}" for e in errors)
    code = shell_exit_code(proc.returncode)
    _merge_child(timeline, directory, instrument)
    if own_dir:
        shutil.rmtree(directory, ignore_errors=True)
    timeline.meta.update(exit_code=code, interrupted=interrupted, seconds=seconds)
    if source is not None and not any(s.gpus for s in timeline.samples):
        timeline.notes.append("no GPU process of the command was found (NVML pids vs its process tree)")
    return WatchResult(code, timeline, interrupted, seconds)


def _sample_until_done(proc: subprocess.Popen, timeline: Timeline, interval_s: float, source, fallback: list[int],
                       t0: float, grace_s: float, ctrl_c: _CtrlC) -> tuple[list[str], bool]:
    """Sample the command's process tree (and its GPUs) until it ends: (sampler errors, interrupted)."""
    def gpu_indices() -> list[int]:
        found = gpus_of_pids(set(process_tree(proc.pid)))
        for g in found:  # what the report names the device by, when the command has no monitor of its own
            timeline.meta.setdefault("device", f"cuda (NVML index {g.index})")
            timeline.meta.setdefault("device_name", g.name)
            timeline.meta.setdefault("device_total_bytes", g.memory_total_bytes)
        return [g.index for g in found] or fallback

    sampler = Sampler(timeline, interval_s, gpu_indices if source is not None else (), source,
                      pids=lambda: process_tree(proc.pid), t0=t0).start()
    try:
        interrupted = _wait(proc, grace_s, ctrl_c)
    finally:
        sampler.stop()
    return sampler.errors, interrupted


def _merge_child(timeline: Timeline, directory: str, instrumented: bool = True) -> None:
    """Fold the per-step files of the command (its gpuwise.monitor's, else the bootstrap's) into the timeline."""
    child = read_rank_files(directory, since_unix=timeline.meta["t0_unix"])  # not an earlier run's files
    if child is not None and not child.steps:
        child = None
    why = "cannot tell the per-step split: the command does not use gpuwise.monitor (and was not instrumented)"
    if child is None and instrumented:
        child, every = read_hook_files(directory, since_unix=timeline.meta["t0_unix"])
        why = hook_diagnosis(every) or why
    if child is None:
        timeline.notes.append(why)
        timeline.meta["step_split_unknown"] = why
        return
    offset = float(child.meta.get("t0_unix", timeline.meta["t0_unix"])) - float(timeline.meta["t0_unix"])
    for s in child.steps:
        s.start_s += offset
    timeline.steps = child.steps
    timeline.noise = child.noise
    if not timeline.noise and instrumented:  # a gpuwise.monitor's files: the bootstrap read the gradients
        hooked, _ = read_hook_files(directory, since_unix=timeline.meta["t0_unix"])
        timeline.noise = hooked.noise if hooked is not None else []
    if not any(s.gpus for s in timeline.samples) and any(s.gpus for s in child.samples):
        for s in child.samples:  # the child saw its GPU where the pid match did not
            s.t_s += offset
        timeline.samples = sorted(timeline.samples + [s for s in child.samples if s.gpus], key=lambda s: s.t_s)
    keep = {"command", "t0_unix"}
    timeline.meta.update({k: v for k, v in child.meta.items() if k not in keep})
    timeline.notes.extend(n for n in child.notes if n not in timeline.notes)
