"""Are a model's blocks alike? The units its full-depth model's blocks repeat in, or why there are none: what
lets plan/tracing/repeat.py rebuild a deep model's step from its first 3 and 4 units' traces.

Checked on the full-depth model built on the meta device (module types, parameter shapes and dtypes, plain
attributes except those that only number the blocks): blocks after the first built alike are a block each
(`ONE`); blocks whose kinds repeat with a period (Gemma-2's sliding and global attention alternating, a
hybrid's attention block every eighth, dense blocks before mixture-of-experts ones) are units of a period
(plan/tracing/repeat_tags.py `Units`), where the small models are made of the full model's first blocks.
"""

from __future__ import annotations

import functools

from ...hf import TASKS, decoded_floats, set_num_layers
from .repeat_tags import (
    CHECKED,
    MIN_LAYERS,
    ONE,
    TRACED,
    Units,
    block_kinds,
    block_signature,
    plain_signatures,
)


def blocks_alike(hf_config, task: str, layers: int) -> str | None:
    """None when the rebuild can reuse the full-depth model's blocks (`block_units` finds its units); else why not."""
    found = block_units(hf_config, task, layers)
    return None if isinstance(found, Units) else found


def block_units(hf_config, task: str, layers: int) -> Units | str:
    """The units the full-depth model's blocks repeat in (plan/tracing/repeat_tags.py `Units`), or why there are
    none. Blocks after the first built alike: a block each (`ONE`). Else blocks whose kinds repeat with a period
    (Gemma-2's sliding and global attention alternating, a hybrid's attention block every eighth, dense blocks
    before mixture-of-experts ones): unit 0 the blocks before the repetition (and as many more as make the rest
    whole periods), then a period at a time; the small models, the model built with the first 3 and 4 units'
    blocks, must be built of those same blocks' kinds (checked on the meta device). Attributes that only number
    the blocks (a `layer_idx`) are left out. Remembered per config (a batch sweep asks again for each batch)."""
    try:
        text = hf_config.to_json_string()
    except (TypeError, ValueError):  # a config attribute JSON cannot hold: ask without remembering
        text = None
    try:
        if text is None:
            return _block_units.__wrapped__(None, hf_config, task, layers)
        return _block_units(text, type(hf_config), task, layers)
    except Exception as exc:  # noqa: BLE001 - not remembered; the step's own build says what is wrong, as the user's error
        return f"the model could not be built on the meta device ({type(exc).__name__}: {exc})"


def _blocks_of(hf_config, task: str, layers: int):
    """The blocks' signatures of the model built on the meta device, per ModuleList of `layers` (an
    encoder-decoder has two), or why there is none."""
    import torch
    import transformers

    with torch.device("meta"):
        model = getattr(transformers, TASKS[task]).from_config(hf_config)
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == layers]
    if not lists:
        return f"no list of {layers} blocks"
    return [[block_signature(b) for b in blocks] for blocks in lists]


@functools.lru_cache(maxsize=16)
def _block_units(config_json: str, config_class, task: str, layers: int) -> Units | str:
    import copy
    import json

    hf_config = config_class if config_json is None else config_class.from_dict(decoded_floats(json.loads(config_json)))
    lists = _blocks_of(hf_config, task, layers)
    if isinstance(lists, str):
        return lists
    # block 0 is traced as itself (the rebuild keeps the first unit's events): it may differ, as a dense first
    # block before mixture-of-experts ones (first_k_dense_replace = 1) or RWKV's extra pre-LayerNorm does
    kinds_of = [block_kinds(sigs) for sigs in lists]
    if all(len(set(kinds[1:])) <= 1 for kinds in kinds_of):
        return ONE
    if len(lists) > 1:  # units of several blocks are one list's
        differ = next(sigs for sigs, kinds in zip(lists, kinds_of) if len(set(kinds[1:])) > 1)
        return f"{len(lists)} lists of {layers} blocks, in one of which {_first_difference(differ)}"
    sigs, kinds = lists[0], kinds_of[0]
    units = _periodic(kinds)
    if units is None:
        return _first_difference(sigs)
    for n in (TRACED, CHECKED):  # the small models are the full model's first blocks, kind for kind
        small = copy.deepcopy(hf_config)
        set_num_layers(small, units.blocks(n))
        m = units.blocks(n)
        got = _blocks_of(small, task, m)
        if isinstance(got, str) or len(got) != 1 or _kinds_side_by_side(sigs[:m], got[0]):
            return (f"{_first_difference(sigs)}; its blocks repeat every {units.period} after {units.first}, but the "
                    f"model built with {m} blocks is not made of the first {m}")
    return units


def _kinds_side_by_side(full: list[list[tuple]], small: list[list[tuple]]) -> bool:
    """Whether the small model's blocks differ from the full model's first ones (in kind, block for block)."""
    both = block_kinds(full + small)  # one numbering of kinds for both (the blocks' indices then count the other's too)
    return both[len(full):] != both[:len(full)]


def _periodic(kinds: list[int]) -> Units | None:
    """The units of the fewest blocks traced (the 4-unit trace's) whose kinds repeat from unit 1 on, with at least
    MIN_LAYERS units and a first unit no longer than the blocks the 4-unit trace leaves out (blocks before the
    repetition are traced in both small traces); None where no period gives that."""
    layers, best = len(kinds), None
    for period in range(1, (layers - 1) // (MIN_LAYERS - 1) + 1):  # a first block and MIN_LAYERS - 1 periods at least
        # the repetition starts after the last block that differs from the one a period later (block 1 at least)
        q = max((i + 1 for i in range(layers - period) if kinds[i] != kinds[i + period]), default=1)
        units = Units(q + (layers - q) % period, period)
        enough = units.unit_of(layers - 1) + 1 >= MIN_LAYERS and units.first <= layers - units.blocks(CHECKED)
        if enough and (best is None or units.blocks(CHECKED) < best.blocks(CHECKED)):
            best = units
    return best


def _first_difference(sigs: list[list[tuple]]) -> str:
    """Why blocks after the first are not alike: the first one that differs from block 1, and where."""
    plain = plain_signatures(sigs)[1:]
    for i, sig in enumerate(plain, start=1):
        if len(sig) != len(plain[0]):
            return f"block {i} has other modules than block 1"
    for pos, entry in enumerate(plain[0]):
        for i, sig in enumerate(plain, start=1):
            if sig[pos] != entry:
                return f"block {i} differs from block 1 (in {sig[pos][0] or 'the block itself'})"
    return "the blocks differ"
