"""Tune: search batch size, DataLoader settings and precision by measurement (plan seeds, measure confirms).

`gpuwise.tune(...)` is the function; once this package has been imported, Python binds the name
`gpuwise.tune` to the package instead (a submodule import sets the parent's attribute). The package is
therefore callable too, so `gpuwise.tune(workload, ...)` works either way.
"""

import sys
import types

from .tuner import TuneResult, tune

__all__ = ["TuneResult", "tune"]


class _CallablePackage(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return tune(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
