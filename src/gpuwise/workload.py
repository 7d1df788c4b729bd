"""Workload files (DESIGN.md contract): load a file, a module or a bundled example, and check it.

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
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .errors import WorkloadError

REQUIRED = ("model", "batch")
OPTIONAL = ("loss", "optimizer", "dataset", "collate")
EXAMPLES_PREFIX = "examples:"


def list_examples() -> list[str]:
    """Names of the bundled examples, as accepted after `examples:`."""
    from . import examples

    return sorted(examples.EXAMPLES)


def check_batch_size(batch_size) -> int:
    """`batch_size` when it is a positive int (not a bool); else WorkloadError, one line."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise WorkloadError(f"batch size must be a positive integer, got {batch_size!r}")
    return batch_size


@dataclass
class Workload:
    """A loaded workload: the user's functions plus checks on what they return."""

    spec: str
    model_fn: Callable[[], Any]
    batch_fn: Callable[[int], Any]
    loss_fn: Callable[[Any, Any], Any] | None = None
    optimizer_fn: Callable[[Any], Any] | None = None
    dataset_fn: Callable[[], Any] | None = None
    collate_fn: Callable[[list], Any] | None = None
    source: str = ""

    @property
    def has_dataset(self) -> bool:
        return self.dataset_fn is not None

    def build_model(self):
        import torch

        model = _call(self, "model", self.model_fn)
        if not isinstance(model, torch.nn.Module):
            raise WorkloadError(f"{self.spec}: model() must return a torch.nn.Module, got {type(model).__name__}")
        return model

    def build_batch(self, batch_size: int):
        check_batch_size(batch_size)
        batch = _call(self, "batch", self.batch_fn, batch_size)
        check_batch(batch, f"{self.spec}: batch({batch_size})")
        return batch

    def build_dataset(self):
        if self.dataset_fn is None:
            raise WorkloadError(f"{self.spec}: defines no dataset() function")
        ds = _call(self, "dataset", self.dataset_fn)
        if not hasattr(ds, "__getitem__"):
            raise WorkloadError(f"{self.spec}: dataset() must return a torch Dataset, got {type(ds).__name__}")
        return ds

    def compute_loss(self, model, batch):
        """Forward pass and scalar loss: the workload's loss(), or `model(**batch).loss` for a dict batch."""
        import torch

        if self.loss_fn is not None:
            out = self.loss_fn(model, batch)
        elif isinstance(batch, Mapping):
            result = model(**batch)
            out = getattr(result, "loss", None)
            if out is None and isinstance(result, Mapping):
                out = result.get("loss")
            if out is None:
                raise WorkloadError(
                    f"{self.spec}: model(**batch) returned no .loss; define loss(model, batch) in the workload"
                )
        else:
            raise WorkloadError(f"{self.spec}: define loss(model, batch) (the batch is not a dict with labels)")
        if not isinstance(out, torch.Tensor) or out.numel() != 1:
            raise WorkloadError(f"{self.spec}: loss() must return a scalar tensor, got {_describe(out)}")
        return out


def check_batch(batch: Any, where: str) -> None:
    """A batch is a Tensor, a tuple/list of them, or a dict of them (non-tensor extras allowed)."""
    import torch

    if isinstance(batch, torch.Tensor):
        return
    if isinstance(batch, (tuple, list)) and batch and any(isinstance(t, torch.Tensor) for t in batch):
        return
    if isinstance(batch, Mapping) and any(isinstance(t, torch.Tensor) for t in batch.values()):
        return
    raise WorkloadError(f"{where} must return a Tensor, a tuple/list of tensors or a dict of tensors, got {_describe(batch)}")


def _describe(obj: Any) -> str:
    return type(obj).__name__ if not hasattr(obj, "shape") else f"{type(obj).__name__} of shape {tuple(obj.shape)}"


def _call(wl: Workload, what: str, fn: Callable, *args):
    try:
        return fn(*args)
    except WorkloadError:
        raise
    except Exception as exc:  # the user's code failed: one line naming where
        raise WorkloadError(f"{wl.spec}: {what}() raised {type(exc).__name__}: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else ""


def load_workload(spec: str | Workload) -> Workload:
    """Load `path/to/job.py`, `pkg.module` or `examples:NAME` and check the contract's functions."""
    if isinstance(spec, Workload):
        return spec
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


def _import(spec: str) -> ModuleType:
    if spec.startswith(EXAMPLES_PREFIX):
        from . import examples

        name = spec[len(EXAMPLES_PREFIX):]
        if name not in examples.EXAMPLES:
            raise WorkloadError(f"no bundled example {name!r}; choose from: {', '.join(sorted(examples.EXAMPLES))}")
        return importlib.import_module(examples.EXAMPLES[name])
    if spec.endswith(".py") or os.sep in spec or os.path.exists(spec):
        return _import_file(spec)
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as exc:
        if exc.name and spec.startswith(exc.name):
            raise WorkloadError(f"no workload file or module {spec!r}") from exc
        raise WorkloadError(f"cannot import workload {spec!r}: {type(exc).__name__}: {_first_line(exc)}") from exc
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
    return f"{type(exc).__name__}: {_first_line(exc)}"
