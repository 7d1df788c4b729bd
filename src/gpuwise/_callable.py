"""`gpuwise.measure(...)`, `gpuwise.tune(...)` and `gpuwise.monitor(...)` are functions named like the
packages that hold them. `gpuwise/__init__.py` resolves the names lazily to the functions, but as soon
as a package is imported, Python's import system binds the package itself to the parent's attribute
(`gpuwise.measure` becomes the package). Making those packages callable keeps the public calls working
whichever happened first."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable


def make_package_callable(package: str, function: Callable) -> None:
    """Calling the package `package` calls `function`."""

    class _CallablePackage(types.ModuleType):
        def __call__(self, *args, **kwargs):
            return function(*args, **kwargs)

    sys.modules[package].__class__ = _CallablePackage
