"""Traces side by side: how many CPUs a round of forks may use (`idle_cpus`), how a round's steps are split
into tasks for them (`fork_tasks`), and the rounds themselves: `ForkedTraces.prefetch`, the part of plan/scaled.py's
`Evaluator` that runs the traces `evaluate` will ask for in forks of the process and keeps what they send back.
plan/fit.py (plan/fit_rounds.py) asks how many CPUs to fill and hands each round's asks to `prefetch`.
"""

from __future__ import annotations

from typing import Any

from ..step import StepConfig
from .memory.events import MemoryTrace, Peak
from .tracer import NotRebuilt, quiet_libraries
from .tracing.alike import blocks_alike
from .tracing.repeat_tags import CHECKED, MIN_LAYERS, TRACED
from .tracing.setup import before_forks


def fork_tasks(keys: list, pairs: set, cpus: int) -> list[tuple[Any, int | None]]:
    """`Evaluator.prefetch`'s tasks for `cpus` forks: (key, None) traces a step (rebuilt in the fork from its 3- and
    4-block traces where it is one of `pairs`), (key, blocks) one of those two small traces. A step is one
    task (its second trace reuses what the fork's first set up: splitting every step made a 7B fit on 2
    CPUs 0.4 s slower, 9.3 vs 8.9 s in-process), but where the tasks would leave a
    CPU idle at the end, the last steps of `pairs` are two tasks each, the longer trace first."""
    tasks: list[tuple[Any, int | None]] = [(key, None) for key in keys]
    for key in [k for k in keys if k in pairs][::-1][:len(keys) % cpus if cpus > 1 else 0]:
        tasks.remove((key, None))
        tasks += [(key, CHECKED), (key, TRACED)]
    return tasks


def idle_cpus() -> int:
    """CPUs this process may use that the last minute's load leaves free (itself counted): forks side by
    side only help where they do not queue behind other work; 1 on a busy or one-CPU machine. The load this
    process and its forks put there themselves (`_own_load`) is not another's: counted, a `--gpu all` fit
    on an idle 2-CPU machine stopped forking after about 40 s of its own forks (load average over 1). Nor is
    the load of processes that have ended: the average lags a minute behind them, so where fewer others are
    runnable now (`_others_running`) that is what counts (a fit run right after another one traced on one
    CPU of an idle two: 12.3 s against 8.8 s)."""
    import os

    usable = len(os.sched_getaffinity(0))
    others = os.getloadavg()[0] - _own_load()
    idle = int(usable - others + 1)
    now = _others_running()
    if now is not None and now < others:  # the average still holds processes that have ended
        idle = max(idle, usable - now)
    return max(1, min(usable, idle))


def _others_running(looks: int = 3) -> int | None:
    """Tasks runnable now that are not this process's threads (the fewest of `looks` looks, 2 ms apart: a
    process busy on a CPU is runnable in every one); None where /proc does not say (not Linux)."""
    import os
    import time

    fewest = None
    for i in range(looks):
        try:
            with open("/proc/loadavg") as f:
                running = int(f.read().split()[3].split("/")[0])
            own = 0
            for task in os.listdir("/proc/self/task"):
                try:
                    with open(f"/proc/self/task/{task}/stat") as f:
                        stat = f.read()
                except OSError:  # a thread that ended meanwhile
                    continue
                own += stat[stat.rindex(")") + 2] == "R"
        except (OSError, ValueError, IndexError):
            return None
        fewest = max(running - own, 0) if fewest is None else min(fewest, max(running - own, 0))
        if i + 1 < looks:
            time.sleep(0.002)
    return fewest


_OWN: list[float] = []  # [when, CPU seconds of this process and its reaped forks then, their load then]


def _own_load() -> float:
    """This process's and its finished forks' share of the 1-minute load average, estimated as the kernel
    averages the load (exponentially, over a minute) from their CPU seconds between calls; 0 at the first."""
    import math
    import os
    import time

    t = os.times()
    now, cpu = time.monotonic(), t.user + t.system + t.children_user + t.children_system
    if not _OWN:
        _OWN[:] = [now, cpu, 0.0]
        return 0.0
    then, cpu_then, load = _OWN
    if now > then:
        decay = math.exp(-(now - then) / 60)
        load = load * decay + (cpu - cpu_then) / (now - then) * (1 - decay)
    _OWN[:] = [now, cpu, load]
    return load


class ForkedTraces:
    """`Evaluator`'s forks (a mixin: the evaluator's own cache and keys, plan/scaled.py): `prefetch` runs a round
    of traces side by side and keeps them, with their replays, as if traced one by one."""

    def prefetch(self, asks: list[tuple], workers: int | None = None) -> None:
        """Run the traces `evaluate` will ask for side by side, one per idle CPU (`workers` to say how many), in
        forks of this process made before any of them runs (after the blocks' comparison every trace shares),
        each tracing its tasks one after another as this process would, and keep them in the same cache, with their replays for the GPUs that ask (`_replays_of`): the answers are the same as traced
        one by one (tests/test_plan_fit.py). An ask is (micro-batch, step, modes, split), then optionally
        whether it is asked `whole` (where the step's rebuild failed: the step traced whole), then the compute
        capability and architecture of the GPU asking (by default this evaluator's). A deep model config's step
        that would leave a CPU idle is two tasks, its 4- and 3-block traces, rebuilt here once the forks are
        done (never while a fork may start: a fork of a process busy in another thread can inherit a held lock
        and hang); a step asked at several micro-batches is checked (its 4-block trace) at one of them only.
        With one idle CPU (or one trace to run) nothing runs here: `evaluate` traces as it asks."""
        import multiprocessing

        todo: dict[tuple, tuple] = {}
        asked: dict[tuple, list[tuple]] = {}  # key -> the asks it answers (its fork replays them)
        steps: dict[tuple, tuple] = {}  # `_steps_key` -> (blocks, step, modes): optimizer steps a swap needs
        for micro_batch, config, modes, split, *more in asks:
            whole = bool(more and more[0])
            capability, arch = (more[1], more[2]) if len(more) > 2 else (self.capability, self.arch)
            stage = self._stage(split)
            with self.on_gpu(arch, capability):
                # asked `whole` (`evaluate(..., whole=True)` after the rebuild failed): the step traced whole
                key = self._key(stage, micro_batch, config, modes, not whole)
                self._shared(key)
                base = self._base(config, stage, modes) if not whole and key not in self._traces else None
                swap = base is not None and not isinstance(
                    self._traces.get(self._key(stage, micro_batch, base, modes, True)), NotRebuilt)
                if swap:  # another optimizer's step is AdamW's, swapped here (`_with_optimizer`): AdamW's is traced
                    for c in (base, config):  # and both optimizers' steps, in forks too
                        if self._steps_key(stage, c, modes) not in self._optimizer_steps:
                            steps.setdefault(self._steps_key(stage, c, modes), (stage, c, modes))
                    config, key = base, self._key(stage, micro_batch, base, modes, True)
                    self._shared(key)
            if key not in self._traces:
                todo.setdefault(key, (stage, micro_batch, config, modes, capability))
                replays = asked.setdefault(key, [])  # the fork replays what was asked, not AdamW's for a swap
                if not swap:
                    replays.append((micro_batch, config, modes, split, whole, capability, arch))
        cpus = workers or idle_cpus()
        # a model config's blocks are compared first (every trace of it asks, shared by the forks)
        alike = self.layers is not None and self.layers >= MIN_LAYERS and \
            blocks_alike(self.wl.hf_config, self.wl.task, self.layers) is None
        # rebuilt steps of the whole depth, not yet checked at another micro-batch (else one 3-block trace); a step
        # asked at several micro-batches is checked at the first, the others (`riders`) trace 3 blocks each and are
        # rebuilt here after it, with its residual
        pairs = {k for k in todo if alike and todo[k][0] is None and k[4] and step_of(k) not in self._checked}
        first: dict[tuple, tuple] = {}
        riders = [k for k in todo if k in pairs and first.setdefault(step_of(k), k) != k]
        keys = [k for k in todo if k not in riders]
        tasks = [((OPTIMIZER_STEPS, k), OPTIMIZER_STEPS, c, None, (stage, modes)) for k, (stage, c, modes) in steps.items()]
        tasks += [(key, blocks, todo[key][2], todo[key][4], asked[key])
                  for key, blocks in fork_tasks(keys, pairs - set(riders), cpus) + [(k, TRACED) for k in riders]]
        n = min(cpus, len(tasks))
        if n < 2 or "fork" not in multiprocessing.get_all_start_methods():
            return
        global _FORKED
        _FORKED = self
        try:
            with (quiet_libraries(),  # the libraries before_forks imports are as quiet as in a trace
                  before_forks([r[3] for r in todo.values()] + [r[2] for r in steps.values()],  # once, not per fork
                               [r[2] for r in todo.values()] + [r[1] for r in steps.values()]),
                  # one fork per CPU, reused: a fork's first trace pays what a process's first trace does (the
                  # fake tensors' dispatch cache, torch's lazy set-up: ~0.2 s of a 7B block trace), once per fork
                  multiprocessing.get_context("fork").Pool(n) as pool):
                done = pool.map(_traced_in_worker, tasks, chunksize=1)
        finally:
            _FORKED = None
        forked: dict[tuple, tuple[dict, dict]] = {}  # key -> (small traces, attention calls), by block count
        for key, blocks, trace, extra, replayed in done:
            if blocks == OPTIMIZER_STEPS:
                if trace is not None:  # else traced again here, where the swap asks for it
                    self._optimizer_steps[key[1]] = trace
            elif blocks is None:
                self._keep(key, trace, extra, replayed)
            elif trace is not None:
                small, calls = forked.setdefault(key, ({}, {}))
                small[blocks], calls[blocks] = trace, extra
        # the riders after the checks whose residual they take; a step whose trace raised in its fork is not
        # rebuilt here: `evaluate` traces it here, and raises
        for key, (small, calls) in sorted(forked.items(), key=lambda kv: kv[0] in riders):
            if len(small) == 2 or key in riders and TRACED in small:
                stage, micro_batch, config, modes, capability = todo[key]
                with self.on_gpu(self.arch, capability):
                    self.rebuilt(stage, micro_batch, config, modes, (small, calls))

    def _keep(self, key: tuple, trace: MemoryTrace | None, failed: tuple | None, replayed: tuple = ((), None)) -> None:
        """A forked whole task's result in the cache, with the replays its fork ran (`_replays_of`)."""
        if trace is not None:
            self._traces[key] = trace
            self.traces_run += traces_in(trace)
            self._remember(key, trace)
            points, peak = replayed
            for rest, point, arch in points:  # keyed by the trace as it is here (`_point`)
                self._points[(id(trace), *rest)] = (trace, point, arch)
            if peak is not None:
                self._peaks[id(trace)] = (trace, peak)
        elif failed is not None:
            self._traces[key] = NotRebuilt(*failed)
            self.traces_run += len(failed[1])
        # else the trace raised: `evaluate` traces it again here and raises as it would have

    def _replays_of(self, key: tuple, trace: MemoryTrace, asks: list[tuple]) -> tuple[list, Peak | None]:
        """In a fork that traced `key`: `asks`' numbers from `trace` as `evaluate` gets them (the replays, the
        step's most expensive part after the trace), sent back with the trace so that the parent does not
        run them one after another (`_keep`): (`_point`'s cache entries of `trace`, less its id; its live peak).
        Nothing where `evaluate` raises here: the parent evaluates, and raises, as it would have."""
        self._traces[key] = trace
        try:
            for micro_batch, config, modes, split, whole, capability, arch in asks:
                with self.on_gpu(arch, capability):  # the asking GPU's replay
                    self.evaluate(micro_batch, config, modes, split, whole=whole)
        except Exception:  # noqa: BLE001 - evaluated (and raised) again in the parent
            return [], None
        points = [(k[1:], point, arch) for k, (kept, point, arch) in self._points.items() if kept is trace]
        return points, self._peaks.get(id(trace), (None, None))[1]


OPTIMIZER_STEPS = "optimizer steps"  # a `prefetch` task: an optimizer's steps traced alone (`_steps_of`)
_FORKED: ForkedTraces | None = None  # the evaluator a prefetch's forked workers trace for


def _traced_in_worker(item: tuple[tuple, int | None, StepConfig, Any, list]) -> tuple[tuple, int | None, Any, Any, Any]:
    """In a forked worker, one task of `prefetch`: (key, blocks, the small trace or None, its attention
    calls, nothing) for one of a step's two small traces; for a whole step (blocks None): (key, None, the
    rebuilt trace or None, (why, small traces) where not rebuilt, the replays of the asks it answers)."""
    key, blocks, config, capability, asks = item
    _FORKED.capability = capability  # traced under the asking GPU's attention kernels (this fork's own copy)
    try:
        if blocks == OPTIMIZER_STEPS:  # an optimizer's steps alone (`asks`: blocks and modes), for a swap
            return key, blocks, _FORKED._steps_of(asks[0], config, asks[1]), None, None
        if blocks is not None:
            return (key, blocks, *_FORKED._blocks(key, blocks, config), None)
        trace = _FORKED._run(key, config)
        return key, None, trace, None, _FORKED._replays_of(key, trace, asks)
    except NotRebuilt as exc:
        return key, None, None, (exc.why, exc.traces), None
    except Exception:  # noqa: BLE001 - traced again in the parent, which raises it as it would have
        return key, blocks, None, None, None


def traces_in(trace: MemoryTrace) -> int:
    """The traces a step took: its 3- and 4-block ones, its 3-block one (checked at another micro-batch), or itself."""
    for note in trace.notes:
        if note.startswith("repeated blocks: traced with"):
            return 2 if note.startswith(f"repeated blocks: traced with {TRACED} and") else 1
    return 1


def step_of(key: tuple) -> tuple:
    """An `Evaluator` key less its micro-batch: the step."""
    return key[:1] + key[2:]
