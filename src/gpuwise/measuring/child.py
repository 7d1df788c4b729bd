"""Run one function in a fresh child process, so an OOM, a crash or a hang never poisons the caller.

`run_isolated("pkg.mod:function", kwargs)` starts a spawned interpreter (CUDA is never initialised in
the parent), calls the function, and returns a `ChildResult`. The function returns a JSON-able dict.
The caller's memory is untouched whatever happens in the child; the child is killed at the timeout.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import first_line
from . import progress
from .oom import is_oom

STATUSES = ("ok", "oom", "error", "timeout", "killed")


@dataclass
class ChildResult:
    status: str                          # one of STATUSES
    value: dict[str, Any] = field(default_factory=dict)  # the function's return value when ok
    error: str = ""                      # one line for oom / error / timeout / killed
    traceback: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def oom(self) -> bool:
        return self.status == "oom"


def _child_main(target: str, kwargs: dict, env: dict, conn) -> None:
    os.environ.update(env)
    progress.set_reporter(lambda p: conn.send(("progress", p.to_dict(), "", "")))
    try:
        module, _, name = target.partition(":")
        fn = getattr(importlib.import_module(module), name)
        conn.send(("ok", fn(**kwargs), "", ""))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, never lost
        status = "oom" if is_oom(exc) else "error"
        conn.send((status, {}, f"{type(exc).__name__}: {first_line(exc)}", traceback.format_exc()))
    finally:
        progress.set_reporter(None)
        conn.close()


def run_isolated(target: str, kwargs: dict | None = None, *, timeout_s: float | None = None,
                 env: dict[str, str] | None = None,
                 on_progress: Callable[[progress.StepProgress], None] | None = None) -> ChildResult:
    """Call `module:function(**kwargs)` in a spawned child; never raises for what happens inside it.

    `on_progress` receives the `StepProgress` the child reports (`measure.progress.step_done`)."""
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    # Not a daemon: the trial may start DataLoader worker processes, which daemons may not have.
    # Instead the child is killed explicitly if the caller is interrupted while waiting.
    proc = ctx.Process(target=_child_main, args=(target, kwargs or {}, env or {}, send), daemon=False)
    start = time.monotonic()
    proc.start()
    send.close()
    message = None
    deadline = None if timeout_s is None else start + timeout_s
    try:
        while message is None:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0)
            if recv.poll(remaining if remaining is not None else 1.0):
                try:
                    message = recv.recv()
                except EOFError:  # the child died without sending
                    break
                if message[0] == "progress":
                    if on_progress is not None:
                        on_progress(progress.StepProgress(**message[1]))
                    message = None
            elif deadline is not None and time.monotonic() >= deadline:
                proc.kill()
                proc.join()
                return ChildResult("timeout", error=f"timed out after {timeout_s:g}s", seconds=time.monotonic() - start)
            elif not proc.is_alive() and not recv.poll():
                break
    except BaseException:  # Ctrl-C or another error in the caller: never leave the child running
        proc.kill()
        proc.join()
        raise
    proc.join()
    seconds = time.monotonic() - start
    if message is None:
        code = proc.exitcode
        why = f"killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        # a child killed by the kernel's OOM killer (SIGKILL) on host memory is reported as killed
        return ChildResult("killed", error=f"the trial process {why} before reporting", seconds=seconds)
    status, value, error, tb = message
    return ChildResult(status, value or {}, error, tb, seconds)
