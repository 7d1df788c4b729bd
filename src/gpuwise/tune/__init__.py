"""Tune: search batch size, DataLoader settings and precision by measurement (plan seeds, measure confirms).

`gpuwise.tune(...)` is the function; once this package has been imported, Python binds the name
`gpuwise.tune` to the package instead (a submodule import sets the parent's attribute). The package is
therefore callable too, so `gpuwise.tune(workload, ...)` works either way.
"""

from .._callable import make_package_callable
from .tuner import TuneResult, tune

__all__ = ["TuneResult", "tune"]


make_package_callable(__name__, tune)  # see gpuwise/_callable.py
