"""Traces side by side: how many CPUs the forks may use (`idle_cpus`), how asked steps are split into tasks for
them (`fork_tasks`), and the forks themselves: `ForkedTraces.forks`, the part of plan/scaled.py's `Evaluator` that
forks workers once and `Forks`, which hands them the traces `evaluate` will ask for as the searches ask them and keeps
what they send back. plan/side_by_side.py runs fit's searches over them.
"""

from __future__ import annotations

import contextlib
import queue
from typing import Any

from ..step import StepConfig
from .memory.events import MemoryTrace, Peak
from .tracer import NotRebuilt, quiet_libraries, swap_base
from .tracing.alike import blocks_alike
from .tracing.repeat_tags import CHECKED, MIN_LAYERS, TRACED
from .tracing.setup import before_forks


def fork_tasks(keys: list, pairs: set, idle: int) -> list[tuple[Any, int | None]]:
    """`Forks`' tasks for `keys` where `idle` workers have nothing to do: (key, None) traces a step (rebuilt in
    its worker from its 3- and 4-block traces where it is one of `pairs`), (key, blocks) one of those two small
    traces. A step is one task (its second trace reuses what the worker's first set up, and the worker rebuilds
    and replays it: this process is free to run the searches), but where the steps are fewer than the idle
    workers, the last steps of `pairs` are two tasks each, the longer trace first."""
    tasks: list[tuple[Any, int | None]] = [(key, None) for key in keys]
    for key in [k for k in keys if k in pairs][::-1][:max(idle - len(keys), 0)]:
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
    """`Evaluator`'s forks (a mixin: the evaluator's own cache and keys, plan/scaled.py): `forks` keeps a pool of
    forked workers busy with the traces `evaluate` will ask for, handing each the next task as it frees up, and
    keeps what they send back, with their replays, as if traced one by one; `prefetch` is one batch of asks."""

    def prefetch(self, asks: list[tuple], workers: int | None = None) -> None:
        """Run the traces `evaluate` will ask for (`asks`) side by side, one worker per idle CPU (`workers` to say
        how many), and keep them: the answers are the same as traced one by one (tests/test_plan_fit.py). With
        one idle CPU nothing runs here: `evaluate` traces as it asks."""
        with self.forks(workers or idle_cpus(), [a[2] for a in asks], [a[1] for a in asks]) as pool:
            if pool is not None:
                pool.submit(asks)
                while pool.needed:
                    pool.wait()

    @contextlib.contextmanager
    def forks(self, workers: int, modes: list, configs: list):
        """Inside: `Forks`, `workers` processes forked from this one now (after the blocks' comparison every
        trace shares, and `before_forks` for these training modes and step configs), that trace what is
        `submit`ted to them; None with fewer than two workers or no fork (the searches trace as they ask)."""
        import multiprocessing

        if workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
            yield None
            return
        # a model config's blocks compared here, once: every trace of it asks (the workers inherit the answer)
        alike = self.layers is not None and self.layers >= MIN_LAYERS and \
            blocks_alike(self.wl.hf_config, self.wl.task, self.layers) is None
        configs = list(configs) + [b for b in (swap_base(c) for c in configs) if b is not None]  # a swap's AdamW
        global _FORKED
        _FORKED = self
        try:
            with (quiet_libraries(),  # the libraries before_forks imports are as quiet as in a trace
                  before_forks(modes, configs),  # once, not per fork
                  # forked once and reused: a worker's first trace pays what a process's first trace does (the
                  # fake tensors' dispatch cache, torch's lazy set-up: ~0.2-0.5 s of a 7B block trace), once
                  multiprocessing.get_context("fork").Pool(workers) as pool):
                forks = Forks(self, pool, workers, alike)
                try:
                    yield forks
                finally:
                    forks.close()
        finally:
            _FORKED = None

    def traced_as(self, ask: tuple) -> tuple[tuple, StepConfig, bool, Any, Any]:
        """`ask`'s cache key as `evaluate` traces it, the step traced (AdamW's where another optimizer is swapped
        in: `_with_optimizer`), whether it is such a swap, the stage and the asking GPU's capability."""
        micro_batch, config, modes, split, *more = ask
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
            if swap:
                key = self._key(stage, micro_batch, base, modes, True)
                self._shared(key)
        return key, base if swap else config, swap, stage, capability

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


class Forks:
    """Workers forked once (`ForkedTraces.forks`) tracing the steps `evaluate` will ask for as they are asked
    (`submit`), each task handed to the next worker that frees up, and kept as they come back (`wait`), so that
    no CPU idles while another still traces the last of a batch of asks. A worker that frees up takes the task
    asked last (a search further along its trials first: its next trial waits on it), in the order a batch
    was asked; a spare one (a trial likely asked next) only where no asked task waits.

    A deep model config's step is one task (its second trace reuses what the worker's first set up; the worker
    rebuilds and replays it) or, where the tasks would leave a worker idle (`fork_tasks`), its 4- and 3-block
    traces, rebuilt here once both are back (the workers were forked before any of this ran: no fork starts
    while this process rebuilds). A step asked at several micro-batches is checked (its 4-block trace) at the
    first only: the others ('riders') trace 3 blocks and are rebuilt here after that check, with its residual
    (handed to a worker with a whole task)."""

    def __init__(self, ev: ForkedTraces, pool: Any, workers: int, alike: bool):
        import threading

        self.ev, self.pool, self.workers = ev, pool, workers
        self._lock = threading.Lock()              # the tasks waiting and running: the pool's result thread hands
        self._running = 0                          # out the next task as one comes back
        self._waiting: list[tuple[int, int, tuple]] = []  # (batch: the last asked highest, -1 spare; order; task)
        self._batches = 0
        self._back: queue.SimpleQueue = queue.SimpleQueue()
        self._todo: dict[tuple, tuple] = {}         # key -> (stage, micro-batch, step, modes, capability), not kept yet
        self._parts: dict[tuple, int] = {}          # key -> its tasks not back yet
        self._small: dict[tuple, tuple[dict, dict]] = {}  # key -> (small traces, attention calls), by block count
        self._first: dict[tuple, tuple] = {}        # step -> the key whose 4-block check its riders wait for
        self._riders: set[tuple] = set()
        self._steps: set[tuple] = set()             # optimizer steps (`_steps_key`) handed out
        self._asked: set[tuple] = set()             # keys asked (the others: spare)
        self._alike = alike                         # a deep model config whose steps are rebuilt from 3 and 4 blocks

    @property
    def needed(self) -> int:
        """Tasks asked (not spare) that are not back yet."""
        return sum(self._parts.get(k, 0) for k in self._asked)

    def flying(self, ask: tuple) -> bool:
        """Whether `ask`'s step is asked and being traced under another GPU's attention kernels (asked again once
        back, where `same_kernels` may share it)."""
        key = self.ev.traced_as(ask)[0]
        return any(k[:-1] == key[:-1] and k != key and k in self._asked for k in self._todo)

    def submit(self, asks: list[tuple], spare: bool = False) -> None:
        """Hand `asks`' traces to the workers, those not kept or handed out already. An ask is (micro-batch, step,
        modes, split), then optionally whether it is asked `whole` (where the step's rebuild failed: the step
        traced whole), then the compute capability and architecture of the GPU asking (by default the
        evaluator's). `spare`: trials likely asked next, taken by a worker only where no asked task waits."""
        ev = self.ev
        todo: dict[tuple, tuple] = {}
        asked: dict[tuple, list[tuple]] = {}  # key -> the asks it answers (its worker replays them)
        steps: dict[tuple, tuple] = {}  # `_steps_key` -> (blocks, step, modes): optimizer steps a swap needs
        again: list[tuple] = []  # keys handed out spare before, asked now
        for ask in asks:
            micro_batch, config, modes, split, *more = ask
            key, traced, swap, stage, capability = ev.traced_as(ask)
            if swap:  # another optimizer's step is AdamW's, swapped (`_with_optimizer`): both optimizers' steps too
                for c in (traced, config):
                    k = ev._steps_key(stage, c, modes)
                    if k not in ev._optimizer_steps and k not in self._steps:
                        steps.setdefault(k, (stage, c, modes))
                    else:
                        again.append((OPTIMIZER_STEPS, k))
            if key in ev._traces or key in self._todo:
                again.append(key)
                continue
            todo.setdefault(key, (stage, micro_batch, traced, modes, capability))
            replays = asked.setdefault(key, [])  # the worker replays what was asked, not AdamW's for a swap
            if not swap:
                whole = bool(more and more[0])
                arch = more[2] if len(more) > 2 else ev.arch
                replays.append((micro_batch, config, modes, split, whole, capability, arch))
        # rebuilt steps of the whole depth not checked yet: the first of a step checks, the others ride on it
        pairs = {k for k in todo if self._alike and todo[k][0] is None and k[4] and step_of(k) not in ev._checked}
        riders = [k for k in todo if k in pairs and self._first.setdefault(step_of(k), k) != k]
        keys = [k for k in todo if k not in riders]
        tasks = [((OPTIMIZER_STEPS, k), OPTIMIZER_STEPS, c, None, (stage, modes), None)
                 for k, (stage, c, modes) in steps.items()]
        with self._lock:
            idle = self.workers - self._running - sum(b >= 0 for b, _, _ in self._waiting)
        for key, blocks in fork_tasks(keys, pairs - set(riders), idle) + [(k, TRACED) for k in riders]:
            residual = ev._checked.get(step_of(key)) if blocks is None else None  # known here, not in the worker
            tasks.append((key, blocks, todo[key][2], todo[key][4], asked[key], residual))
        self._todo.update(todo)
        self._riders.update(riders)
        self._steps.update(steps)
        for task in tasks:
            self._parts[task[0]] = self._parts.get(task[0], 0) + 1
        with self._lock:
            self._batches += 1
            self._waiting += [(-1, i, task) for i, task in enumerate(tasks)]
            if not spare:
                for key in again + list(dict.fromkeys(t[0] for t in tasks)):
                    self._ask(key)
            self._hand_out()

    def _ask(self, key: tuple) -> None:
        """`key` asked (not spare): its waiting tasks go with this batch, and so does the check a rider of it
        waits for. Under the lock."""
        if key in self._asked or key not in self._parts:
            return
        self._asked.add(key)
        self._waiting = [(self._batches, i, t) if t[0] == key else (b, i, t) for b, i, t in self._waiting]
        if key in self._riders:
            self._ask(self._first.get(step_of(key), key))

    def close(self) -> None:
        """No task is handed out from now on (the pool is terminated next: a spare task still running is dropped)."""
        with self._lock:
            self._waiting.clear()

    def _hand_out(self) -> None:
        """The waiting tasks that the idle workers take: the last batch asked first, spare ones last. Under the lock."""
        while self._waiting and self._running < self.workers:
            best = max(self._waiting, key=lambda w: (w[0], -w[1]))
            self._waiting.remove(best)
            self._running += 1
            task = best[2]
            self.pool.apply_async(_traced_in_worker, (task,), callback=self._came_back,
                                  error_callback=lambda _exc, t=task: self._came_back((t[0], t[1], None, None, None)))

    def _came_back(self, result: tuple) -> None:
        """In the pool's result thread: a task is back; the next one to the worker that frees up, at once."""
        self._back.put(result)
        with self._lock:
            self._running -= 1
            self._hand_out()

    def wait(self) -> None:
        """Until a task is back; then what is back is kept (a step rebuilt once its traces and, for a rider, its
        check are)."""
        got = [self._back.get()]
        with contextlib.suppress(queue.Empty):
            while True:
                got.append(self._back.get_nowait())
        for key, blocks, trace, extra, replayed in got:
            self._parts[key] -= 1
            if blocks == OPTIMIZER_STEPS:
                if trace is not None:  # else traced again here, where the swap asks for it
                    self.ev._optimizer_steps[key[1]] = trace
                continue
            if blocks is None:
                self.ev._keep(key, trace, extra, replayed)
            elif trace is not None:
                small, calls = self._small.setdefault(key, ({}, {}))
                small[blocks], calls[blocks] = trace, extra
        self._settle()

    def _settle(self) -> None:
        """The steps whose tasks are all back: rebuilt here from their small traces (a rider after its check). A
        step whose trace raised in its worker is not: `evaluate` traces it here, and raises."""
        ev = self.ev
        settled = True
        while settled:
            settled = False
            for key in [k for k in self._todo if not self._parts.get(k)]:
                step = step_of(key)
                if key in self._riders and self._first.get(step, key) != key:
                    continue  # its check is not kept yet
                stage, micro_batch, config, modes, capability = self._todo.pop(key)
                small, calls = self._small.pop(key, ({}, {}))
                if len(small) == 2 or key in self._riders and TRACED in small:
                    with ev.on_gpu(ev.arch, capability):
                        ev.rebuilt(stage, micro_batch, config, modes, (small, calls))
                self._riders.discard(key)
                if self._first.get(step) == key:
                    del self._first[step]
                settled = True


OPTIMIZER_STEPS = "optimizer steps"  # a `Forks` task: an optimizer's steps traced alone (`_steps_of`)
_FORKED: ForkedTraces | None = None  # the evaluator the forked workers trace for


def _traced_in_worker(item: tuple[tuple, int | None, StepConfig, Any, list, Any]) -> tuple[tuple, int | None, Any, Any, Any]:
    """In a forked worker, one task of `Forks`: (key, blocks, the small trace or None, its attention
    calls, nothing) for one of a step's two small traces; for a whole step (blocks None): (key, None, the
    rebuilt trace or None, (why, small traces) where not rebuilt, the replays of the asks it answers), its step's
    residual from another micro-batch's check where the parent had one when it handed the task out."""
    key, blocks, config, capability, asks, residual = item
    _FORKED.capability = capability  # traced under the asking GPU's attention kernels (this fork's own copy)
    if residual is not None:
        _FORKED._checked.setdefault(step_of(key), residual)
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
