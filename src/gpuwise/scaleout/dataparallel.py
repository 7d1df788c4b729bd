"""Finding nn.DataParallel in a workload's model, and why DistributedDataParallel replaces it."""

from __future__ import annotations

ADVICE = (
    "nn.DataParallel runs all GPUs from one Python process with one thread per GPU, so the GIL "
    "serialises much of the work; every step it copies the weights from GPU 0 to the others, scatters "
    "the batch from and gathers the outputs and gradients back to GPU 0, which therefore holds more "
    "memory and does more work than the rest. DistributedDataParallel runs one process per GPU, keeps a "
    "full replica on each, and overlaps a bucketed allreduce of the gradients with the backward pass: "
    "return the bare model from model() and run it with `gpuwise train -n N` (or `gpuwise launch`)."
)


def find_data_parallel(model) -> list[str]:
    """Names of the nn.DataParallel modules in `model` ('' for the model itself)."""
    from torch import nn

    return [name for name, m in model.named_modules() if isinstance(m, nn.DataParallel)]


def data_parallel_message(model) -> str | None:
    """One message when `model` contains nn.DataParallel, else None."""
    names = find_data_parallel(model)
    if not names:
        return None
    where = "the model is" if names == [""] else "modules " + ", ".join(repr(n or "<model>") for n in names) + " are"
    return f"{where} wrapped in nn.DataParallel: {ADVICE}"


def unwrap_data_parallel(model):
    """The model with every nn.DataParallel replaced by the module it wraps (DDP does the parallelism)."""
    from torch import nn

    if isinstance(model, nn.DataParallel):
        return unwrap_data_parallel(model.module)
    for name, child in list(model.named_children()):
        if isinstance(child, nn.DataParallel) or find_data_parallel(child):
            setattr(model, name, unwrap_data_parallel(child))
    return model
