"""The workload contract as a value (docs/contracts.md "Workload files"): `Workload` and the checks on what its
functions return. Loading a workload from a file, a module, an example or a model config is workload.py's
and hf.py's (model configs); both build this. Every problem is a `WorkloadError` whose message fits on one line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import WorkloadError


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
        raise WorkloadError(f"{wl.spec}: {what}() raised {type(exc).__name__}: {first_line(exc)}") from exc


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else ""
