"""What `estimate` / `fit` accept, turned into a Workload and a batch size (one place for both)."""

from __future__ import annotations

from typing import Any

from ..errors import GpuwiseError
from ..hf import hf_workload, is_config_source, model_workload
from ..workload import Workload, check_batch_size


def resolve_inputs(workload: Any, batch_size: int | None, model: Any = None, batch: Any = None, loss: Any = None,
                   seq_len: int | None = None, task: str | None = None,
                   target_len: int | None = None) -> tuple[Workload | str, int]:
    """(workload, batch size) from a workload spec, an `hf:` id / config.json, or a model object."""
    if model is not None:
        if workload is not None:
            raise GpuwiseError("pass either a workload or model=..., not both")
        if batch is None:
            raise GpuwiseError("model=... needs batch= (a function batch(batch_size) or one example batch)")
        workload, size = model_workload(model, batch, loss)
        batch_size = batch_size if batch_size is not None else size
    elif workload is None:
        raise GpuwiseError("nothing to estimate: pass a workload (file, examples:NAME, hf:ORG/NAME, config.json) "
                           "or model=..., batch=...")
    elif is_config_source(workload):
        workload = hf_workload(workload, seq_len, task, target_len=target_len)
    elif seq_len is not None or task is not None or target_len is not None:
        raise GpuwiseError("--seq-len / --task / --target-len apply to hf:ORG/NAME and config.json inputs only")
    if batch_size is None:
        raise GpuwiseError("a batch size is needed (batch_size=..., or an example batch with a batch dimension)")
    return workload, check_batch_size(batch_size)
