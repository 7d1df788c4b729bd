"""Makes the packages named in GPUWISE_TEST_HIDE (comma-separated) look not installed in this process:
`import peft` raises ModuleNotFoundError and `importlib.util.find_spec("peft")` is None, as on a base
install. Put this folder first on PYTHONPATH of a child process (tests/test_base_install.py)."""

import importlib.machinery
import os

_HIDDEN = frozenset(n for n in os.environ.get("GPUWISE_TEST_HIDE", "").split(",") if n)
_find_spec = importlib.machinery.PathFinder.find_spec.__func__


def _hiding_find_spec(cls, name, path=None, target=None):
    if name.partition(".")[0] in _HIDDEN:
        return None
    return _find_spec(cls, name, path, target)


importlib.machinery.PathFinder.find_spec = classmethod(_hiding_find_spec)
