"""Models run through `torch.compile`: the trace is eager PyTorch's, an upper bound for inductor's.

The tracer sees aten ops one by one; inductor (torch/_inductor) fuses them into generated kernels that
keep fewer intermediates alive (a conv + BatchNorm + ReLU net peaks 37 % lower compiled than eager on
the CPU; an MLP the same), and which it keeps is decided by its scheduler, not modelled here. So a
compiled model is traced as it would run uncompiled, and the estimate says it is an upper bound. Its speed is
priced as the fusing compiler runs it, as `--compile` asks (plan/speed/fusion.py).
"""

from __future__ import annotations

COMPILED_NOTE = "compiled: upper bound"  # the note's start (`compiled_notes`)


def compiled_step(notes: list[str]) -> bool:
    """Whether a trace with these notes is of a model run through torch.compile (`compiled_notes`): the speed
    model prices its step fused, as `--compile` asks (plan/estimate.py, plan/fit.py)."""
    return any(n.startswith(COMPILED_NOTE) for n in notes)


def compiled_modules(model) -> list[str]:
    """Dotted names of the modules wrapped by torch.compile (`Module.compile()` or `torch.compile(m)`)."""
    names = []
    for name, m in model.named_modules():
        if getattr(m, "_compiled_call_impl", None) is not None or type(m).__name__ == "OptimizedModule":
            names.append(name or "(the model)")
    return names


def compiled_notes(model) -> list[str]:
    names = compiled_modules(model)
    if not names:
        return []
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return [f"{COMPILED_NOTE} ({shown} run through torch.compile, traced as eager PyTorch runs them; "
            "inductor's fused kernels keep fewer intermediates, e.g. 37% less on a conv+BatchNorm net)"]
