"""Steps whose memory is random: the trace takes the step that needs the most.

LayerDrop (Fan et al. 2019, "Reducing Transformer Depth on Demand with Structured Dropout") skips
whole blocks at random while training: transformers' encoders and decoders draw one number per block
and skip it when the number is under `config.layerdrop` / `encoder_layerdrop` / `decoder_layerdrop` /
`speech_encoder_layerdrop` (51 model files, e.g. wav2vec2, HuBERT, WavLM, M2M-100, SeamlessM4T;
many copy the value into the block list's `self.layerdrop` at construction). A skipped block makes
no activations and, on the first step, gets no gradient and so no optimizer state: one traced step
is one random draw, off by a block's share either way (a block of HuBERT-base is 28 MB of a 535 MB
peak). A training run soon meets a step that runs every block, and that step is the one that runs
out of memory; so the trace turns layer drop off and says so. With the probability at 0 most of
these models do not draw at all (`if self.training and self.config.layerdrop > 0.0`), which also
spares the fake trace a data-dependent `.item()`.
"""

from __future__ import annotations

import contextlib
import numbers


def _is_drop_name(name: str) -> bool:
    n = name.lower()
    return "layerdrop" in n or "layer_drop" in n


def _configs(obj, seen: set[int]):
    """A HF-style config (anything with `to_dict`) and the sub-configs it holds (text_config, ...)."""
    if obj is None or id(obj) in seen or not hasattr(obj, "to_dict"):
        return
    seen.add(id(obj))
    yield obj
    for value in list(vars(obj).values()):
        yield from _configs(value, seen)


def _drop_attributes(obj) -> list[tuple[str, float]]:
    try:
        items = list(vars(obj).items())
    except TypeError:
        return []
    return [(k, v) for k, v in items if _is_drop_name(k) and isinstance(v, numbers.Real)
            and not isinstance(v, bool) and 0 < v < 1]


@contextlib.contextmanager
def every_layer_runs(model):
    """Turn layer drop off in `model` (its modules' attributes and their configs) while the block runs;
    yields the notes to report (empty when the model has none). Restored on exit: the config object
    may be the user's, shared with every model they build."""
    changed: list[tuple[object, str, float]] = []
    seen: set[int] = set()
    for module in model.modules():
        holders = [module, *_configs(getattr(module, "config", None), seen)]
        for holder in holders:
            for name, value in _drop_attributes(holder):
                changed.append((holder, name, value))
    for holder, name, _value in changed:
        setattr(holder, name, 0.0)
    notes = []
    if changed:
        probs = sorted({f"{name}={value:g}" for _h, name, value in changed})
        notes.append(f"layer drop off in the trace ({', '.join(probs)}): the estimate is a step that runs every "
                     "block, the one a training run's peak comes from (a step that drops blocks needs less)")
    try:
        yield notes
    finally:
        for holder, name, value in reversed(changed):
            setattr(holder, name, value)
