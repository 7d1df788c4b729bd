"""Workload files (docs/contracts.md contract): load a file, a module or a bundled example, and check it.

A workload defines `model()` and `batch(batch_size)`, and optionally `loss(model, batch)`,
`optimizer(params)`, `dataset()` and `collate(samples)`. Loading checks that the required functions
exist; calling checks that they return the right types. Every problem is a `WorkloadError` whose
message fits on one line.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Callable
from types import ModuleType

from .contract import Workload, check_batch, check_batch_size, first_line
from .errors import WorkloadError
from .hf import hf_workload  # a model config: random weights, token batches

# the contract's value and checks live in contract.py (below every source of workloads, hf.py too)
__all__ = ["EXAMPLES_PREFIX", "Workload", "check_batch", "check_batch_size", "from_module", "list_examples",
           "load_workload"]

REQUIRED = ("model", "batch")
OPTIONAL = ("loss", "optimizer", "dataset", "collate")
EXAMPLES_PREFIX = "examples:"


def list_examples() -> list[str]:
    """Names of the bundled examples, as accepted after `examples:`."""
    from . import examples

    return sorted(examples.EXAMPLES)


def load_workload(spec: str | Workload) -> Workload:
    """Load `path/to/job.py`, `pkg.module`, `examples:NAME`, `hf:ORG/NAME` or a config.json and check the
    contract's functions."""
    if isinstance(spec, Workload):
        return spec
    if isinstance(spec, str) and (spec.startswith("hf:") or spec.endswith(".json")):
        return hf_workload(spec)
    module = _import(spec)
    return from_module(module, spec)


def from_module(module: ModuleType, spec: str) -> Workload:
    fns: dict[str, Callable | None] = {}
    for name in REQUIRED + OPTIONAL:
        fn = getattr(module, name, None)
        if fn is None:
            if name in REQUIRED:
                sig = "batch(batch_size)" if name == "batch" else "model()"
                raise WorkloadError(f"workload {spec!r} defines no {sig} function (required)")
            fns[name] = None
            continue
        if not callable(fn):
            raise WorkloadError(f"workload {spec!r}: {name} must be a function, got {type(fn).__name__}")
        fns[name] = fn
    _check_arity(spec, "batch", fns["batch"], 1)
    if fns["loss"] is not None:
        _check_arity(spec, "loss", fns["loss"], 2)
    return Workload(
        spec=spec, model_fn=fns["model"], batch_fn=fns["batch"], loss_fn=fns["loss"],
        optimizer_fn=fns["optimizer"], dataset_fn=fns["dataset"], collate_fn=fns["collate"],
        source=getattr(module, "__file__", "") or "",
    )


def _check_arity(spec: str, name: str, fn: Callable, n: int) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*range(n))
    except TypeError:
        raise WorkloadError(f"workload {spec!r}: {name}() must take {n} argument(s), its signature is {name}{sig}") from None


_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")  # ORG/NAME as the Hub spells a model id


def _import(spec: str) -> ModuleType:
    if spec.startswith(EXAMPLES_PREFIX):
        from . import examples

        name = spec[len(EXAMPLES_PREFIX):]
        if name not in examples.EXAMPLES:
            raise WorkloadError(f"no bundled example {name!r}; choose from: {', '.join(sorted(examples.EXAMPLES))}")
        return importlib.import_module(examples.EXAMPLES[name])
    if spec.endswith(".py") or os.sep in spec or os.path.exists(spec):
        if not spec.endswith(".py") and not os.path.exists(spec) and _HUB_NAME.fullmatch(spec):
            raise WorkloadError(f"no workload file {spec!r}; for the Hugging Face model, write hf:{spec}")
        return _import_file(spec)
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as exc:
        if exc.name and spec.startswith(exc.name):
            raise WorkloadError(f"no workload file or module {spec!r}") from exc
        raise WorkloadError(f"cannot import workload {spec!r}: {type(exc).__name__}: {first_line(exc)}") from exc
    except Exception as exc:
        raise WorkloadError(f"cannot import workload {spec!r}: {_syntax(exc)}") from exc


def _import_file(path: str) -> ModuleType:
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise WorkloadError(f"no workload file {path!r}")
    name = "gpuwise_workload_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise WorkloadError(f"cannot load {path!r} as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # needed by pickling (DataLoader workers) and dataclasses in the file
    folder = os.path.dirname(path)
    sys.path.insert(0, folder)  # lets the file import its neighbours
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise WorkloadError(f"cannot load workload {path!r}: {_syntax(exc)}") from exc
    finally:
        if sys.path and sys.path[0] == folder:
            sys.path.pop(0)
    return module


def _syntax(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg} (line {exc.lineno})"
    return f"{type(exc).__name__}: {first_line(exc)}"
