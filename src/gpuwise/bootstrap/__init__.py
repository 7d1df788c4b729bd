"""Zero-code instrumentation of a user's command: a `sitecustomize` on the child's PYTHONPATH.

`environment(folder, ...)` writes `folder/site/sitecustomize.py` and returns the environment variables
that put it first on PYTHONPATH. Python imports `sitecustomize` at start-up in every process the command
starts (torchrun ranks, `accelerate launch` children, spawned DataLoader workers), so each of them runs
ours: it first runs the `sitecustomize` it hides (a distribution's or the user's, found further down
sys.path), then loads `hooks.py` by its file path (no import of gpuwise or torch) and waits for
`import torch` to hook the loader, the copies and the optimizer steps. Each process that trained writes
`hooks-rank{R}-pid{P}.jsonl` into the folder; `read_hook_files` merges them into one `Timeline`.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from .hooks import ENV_DIR, ENV_FLUSH_S, ENV_OVERRIDES, OVERRIDABLE

if TYPE_CHECKING:
    from ..monitor.timeline import Timeline

__all__ = ["ENV_DIR", "OVERRIDABLE", "environment", "read_hook_files", "hook_diagnosis"]

_SITE = '''\
# Written by gpuwise (watch / tune): instruments this Python process; see gpuwise/bootstrap/__init__.py.
import os as _os
import sys as _sys


def _gpuwise_chain():
    """Run the sitecustomize this one hides (the next one on sys.path), as Python would have."""
    import importlib.machinery
    import importlib.util

    here = _os.path.dirname(_os.path.abspath(__file__))
    rest = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _gpuwise_hooks():
    import importlib.util

    spec = importlib.util.spec_from_file_location("_gpuwise_hooks", {hooks!r})
    module = importlib.util.module_from_spec(spec)
    _sys.modules["_gpuwise_hooks"] = module
    spec.loader.exec_module(module)
    module.install()


try:
    _gpuwise_chain()
except Exception as _exc:  # the hidden sitecustomize failed: Python would have printed this too
    _sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\\n{{type(_exc).__name__}}: {{_exc}}\\n")
try:
    _gpuwise_hooks()
except Exception as _exc:
    _sys.stderr.write(f"gpuwise: cannot instrument this process ({{type(_exc).__name__}}: {{_exc}})\\n")
'''


def environment(folder: str, base_env: dict | None = None, overrides: dict | None = None,
                flush_every_s: float | None = None) -> dict[str, str]:
    """The environment for a command instrumented into `folder` (created): `base_env` (os.environ by
    default) with our sitecustomize first on PYTHONPATH, and DataLoader `overrides` for tune trials."""
    from . import hooks

    site = os.path.join(folder, "site")
    os.makedirs(site, exist_ok=True)
    with open(os.path.join(site, "sitecustomize.py"), "w") as fh:
        fh.write(_SITE.format(hooks=os.path.abspath(hooks.__file__)))
    env = dict(os.environ if base_env is None else base_env)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = site + (os.pathsep + old if old else "")
    env[ENV_DIR] = folder
    if overrides:
        bad = set(overrides) - set(OVERRIDABLE)
        if bad:
            raise ValueError(f"cannot override DataLoader {sorted(bad)}: only {', '.join(OVERRIDABLE)}")
        env[ENV_OVERRIDES] = json.dumps(overrides)
    if flush_every_s is not None:
        env[ENV_FLUSH_S] = str(flush_every_s)
    return env


def _hook_file_names(folder: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(folder) if n.startswith("hooks-rank") and n.endswith(".jsonl"))
    except OSError:
        return []


def read_hook_files(folder: str, since_unix: float | None = None) -> tuple[Timeline | None, list[Timeline]]:
    """(the merged timeline of the processes that stepped an optimizer or None, every process's timeline);
    with `since_unix`, files of processes started before then (an earlier run's) are left out."""
    from ..monitor.timeline import merge_timelines, read_timeline

    every = [read_timeline(os.path.join(folder, n)) for n in _hook_file_names(folder)]
    if since_unix is not None:
        every = [t for t in every if float(t.meta.get("t0_unix", since_unix)) >= since_unix]
    stepping = [t for t in every if t.steps]
    return (merge_timelines(stepping) if stepping else None), every


def hook_diagnosis(every: list[Timeline]) -> str | None:
    """Why no per-step split could be made ("cannot tell ..."), or None when some process had steps."""
    if any(t.steps for t in every):
        return None
    if not every:
        return ("cannot tell the per-step split: no Python process of the command imported torch with gpuwise's "
                "bootstrap (not a Python/PyTorch command, a Python that ignores PYTHONPATH or sitecustomize "
                "(python -S / -I), or it ended before importing torch)")
    batches = sum(int(t.meta.get("loader_batches") or 0) for t in every)
    if batches:
        wait = sum(float(t.meta.get("loader_wait_s") or 0.0) for t in every)
        return (f"cannot tell the per-step split: {batches} DataLoader batches were loaded but no torch.optim "
                "optimizer step was seen (a hand-written update, or an optimizer that does not subclass "
                "torch.optim.Optimizer)" + (f"; {wait:.1f} s waiting for batches" if wait else ""))
    return ("cannot tell the per-step split: torch was imported but neither a DataLoader batch nor an optimizer "
            "step was seen (inference only, or a loop that does not use torch.utils.data.DataLoader)")
