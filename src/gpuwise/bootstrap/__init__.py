"""Zero-code instrumentation of a user's command: a `sitecustomize` on the child's PYTHONPATH.

`environment(folder, ...)` writes `folder/site/sitecustomize.py` and returns the environment variables
that put it first on PYTHONPATH. Python imports `sitecustomize` at start-up in every process the command
starts (torchrun ranks, `accelerate launch` children, spawned DataLoader workers), so each of them runs
ours: it first runs the `sitecustomize` it hides (a distribution's or the user's, found further down
sys.path), then loads `hooks.py` by its file path (no import of gpuwise or torch) and waits for
`import torch` to hook the loader, the copies and the optimizer steps. Each process that trained writes
`hooks-rank{R}-pid{P}.jsonl` into the folder; `gpuwise.monitoring.hookfiles.read_hook_files` merges them
into one `Timeline` (this package imports nothing of the monitor: the monitor reads what it leaves).
"""

from __future__ import annotations

import json
import os

from . import hooks
from .hooks import ENV_DIR, ENV_FLUSH_S, ENV_OVERRIDES, OVERRIDABLE

__all__ = ["ENV_DIR", "OVERRIDABLE", "environment"]

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
