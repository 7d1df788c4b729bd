"""Which repeated block (layer) each traced memory event belongs to: what plan/tracing/repeat.py needs to
rebuild the events of an L-layer model from a 3-layer trace.

An event belongs to layer i when it happens while `<blocks>.i` (or a module inside it) runs, forward or
backward. Outside the blocks (the optimizer, zero_grad, the model's construction, the head and loss, and
autograd's AccumulateGrad, which runs in no module) an allocation belongs to the layer its inputs belong
to: a parameter to the block it sits in (by name), a gradient or optimizer state to its parameter's block,
the i-th output of a foreach op to the layer of the i-th element of its input lists; a free outside the
blocks to the layer of the storage it frees. Events whose inputs mix layers or have none belong to none
(None).

An encoder-decoder whose two stacks are equally deep (T5, BART) has two lists of L blocks: layer i is both
stacks' i-th block (the encoder's runs over its blocks, then the decoder's; each run is rebuilt the same way).

"Layer" here is the rebuild's unit (`Units`): one block, or in a model whose blocks alternate kinds (Gemma-2's
sliding and global attention, a hybrid's every-eighth attention block), the first blocks together, then `period`
consecutive blocks at a time. A model of alike blocks has units of one block: unit i is block i.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...step import tensors_in

TRACED = 3        # blocks in the trace the events are rebuilt from: first, middle, last
CHECKED = 4       # blocks in the trace the rebuild is checked against
MIN_LAYERS = 6    # below this, tracing the model whole costs about as much as the 3- and 4-block traces
MIDDLE = 1  # the traced units are first, middle, last (plan/tracing/repeat.py): the middle one is any inner unit


def block_at(module: str, prefixes: tuple[str, ...]) -> tuple[str, int, str] | None:
    """(the list's prefix, the block's index, the module's path inside the block) of a module inside one of the
    blocks' lists (`prefixes`: their dotted paths with a trailing "."); None outside them."""
    for prefix in prefixes:
        if module.startswith(prefix):
            head, _, rest = module[len(prefix):].partition(".")
            return (prefix, int(head), rest) if head.isdigit() else None
    return None


@dataclass(frozen=True)
class Units:
    """How a model's blocks group into the units the rebuild repeats: unit 0 is the first `first` blocks (traced as
    themselves), every later unit `period` consecutive blocks, each unit's blocks of the same kinds in the same
    order as every other's (plan/tracing/alike.py `block_units`)."""

    first: int = 1
    period: int = 1

    def blocks(self, units: int) -> int:
        """Blocks in `units` units."""
        return self.first + (units - 1) * self.period

    def unit_of(self, block: int) -> int:
        return 0 if block < self.first else 1 + (block - self.first) // self.period

    def start(self, unit: int) -> int:
        """The unit's first block."""
        return 0 if unit == 0 else self.first + (unit - 1) * self.period


ONE = Units()  # alike blocks: a unit is a block


def block_signature(block) -> list[tuple]:
    """Module types, parameter / buffer shapes, dtypes, trainability, and plain attributes of one block:
    (name, module type, attributes) per module, (name, shape, dtype, requires_grad | "buffer") per tensor."""
    sig = []
    for name, m in block.named_modules():
        attrs = tuple(sorted((k, v) for k, v in vars(m).items()
                             if isinstance(v, (bool, int, float, str, type(None))) and not k.startswith("_")))
        sig.append((name, type(m).__qualname__, attrs))
    for name, p in block.named_parameters():
        sig.append((name, tuple(p.shape), str(p.dtype), p.requires_grad))
    for name, b in block.named_buffers():
        sig.append((name, tuple(b.shape), str(b.dtype), "buffer"))
    return sig


def block_kinds(sigs: list[list[tuple]]) -> list[int]:
    """Each block's kind: blocks of equal signatures, less the attributes that only number them, share one."""
    numbered: dict[tuple, int] = {}
    return [numbered.setdefault(plain, len(numbered)) for plain in plain_signatures(sigs)]


def plain_signatures(sigs: list[list[tuple]]) -> list[tuple]:
    """The blocks' signatures less the attributes that only number the blocks (an int attribute whose value less
    the block's index is the same in every block after the first that has it, two at least: a `layer_idx`)."""
    values: dict[tuple, list] = {}
    for i, sig in enumerate(sigs[1:], start=1):
        for entry in sig:
            if len(entry) == 3:  # a module: (name, type, attributes)
                for k, v in entry[2]:
                    values.setdefault((entry[0], k), []).append(v - i if type(v) is int else None)
    numbering = {key for key, offsets in values.items()
                 if len(offsets) > 1 and None not in offsets and len(set(offsets)) == 1}
    return [tuple((e[0], e[1], tuple((k, v) for k, v in e[2] if (e[0], k) not in numbering)) if len(e) == 3 else e
                  for e in sig) for sig in sigs]


@dataclass
class EventLayers:
    """Per event of a trace (same order): the unit it belongs to; per block of storage: the unit of its storage."""

    prefixes: tuple[str, ...]        # dotted paths of the blocks' ModuleLists, each with a trailing "."
    count: int                       # how many units the traced model had
    event_layer: list[int | None]
    block_layer: dict[int, int | None]
    units: Units = ONE               # how its blocks make the units


class LayerTags:
    """Attached to the tracer (`TraceMode.layers`) while a model with repeated blocks is traced."""

    def __init__(self, prefixes: tuple[str, ...], count: int, units: Units = ONE):
        self.prefixes, self.units = prefixes, units
        self.count = units.unit_of(count - 1) + 1  # units
        self._every_block = sorted(units.unit_of(b) for b in range(count))  # one per block: each one's unit
        self.block_layer: dict[int, int | None] = {}
        self._inputs: list = []           # per input: a unit, or a list of units (a foreach list)
        self.output_index: int | None = None
        self.kinds: list[int] | None = None  # each block's kind (`block_kinds`), for units of several kinds

    @classmethod
    def follow(cls, mode, model, count: int, units: Units = ONE) -> LayerTags | None:
        """Tags for `model`'s ModuleLists of `count` blocks, by `units` (None where there is none, or several and
        units of several blocks: the rebuild's units are then one list's)."""
        import torch

        found = [name for name, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) == count]
        if not found or not all(found) or (len(found) > 1 and units != ONE):
            return None
        tags = cls(tuple(name + "." for name in found), count, units)
        if units != ONE:
            tags.kinds = block_kinds([block_signature(b) for b in model.get_submodule(found[0])])
        tags.tag_parameters(mode, model)
        tags.tag_construction(mode, [model.get_submodule(name) for name in found])
        return tags

    def layer_of(self, module: str) -> int | None:
        """The unit of the block `module` is in (None outside the blocks)."""
        at = block_at(module, self.prefixes)
        return None if at is None else self.units.unit_of(at[1])

    def tag_parameters(self, mode, model) -> None:
        """Parameters and buffers belong to the block they sit in (they are built outside any forward)."""
        for name, t in list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers()):
            block = mode.block_of(t) if t is not None else None
            if block is not None:
                self.block_layer[block] = self.layer_of(name.rsplit(".", 1)[0])

    def tag_construction(self, mode, lists) -> None:
        """What was made for a block's modules while the model was built (temporaries of its `__init__` and of
        its weights' initialisation: Mamba's A_log and dt_bias, GPT-J's sinusoidal positions), in no module's
        forward, is that block's: the tracer notes the module each storage was made for (`TraceMode.built_in`)."""
        owner = {id(m): self.units.unit_of(i)
                 for blocks in lists for i, block in enumerate(blocks) for m in block.modules()}
        for block, ref in mode.built_in.items():
            module = ref()  # None: a module that died during the construction, no block's
            if self.block_layer.get(block) is None and module is not None and id(module) in owner:
                self.block_layer[block] = owner[id(module)]

    def tag_optimizer_state(self, mode, optimizer) -> None:
        """A parameter's optimizer state (its step counter too, made from no input) is its block's."""
        for p, state in optimizer.state.items():
            block = mode.block_of(p)
            layer = None if block is None else self.block_layer.get(block)
            for t in tensors_in(list(state.values())):
                b = mode.block_of(t)
                if b is not None:
                    self.block_layer[b] = layer

    # --- called by the tracer ------------------------------------------------------------------------
    def set_inputs(self, mode, args, kwargs) -> None:
        import torch

        def layer(t):
            block = mode.block_of(t)
            return None if block is None else self.block_layer.get(block)

        inputs: list = []
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, torch.Tensor):
                inputs.append(layer(a))
            elif isinstance(a, (list, tuple)) and a and all(isinstance(t, torch.Tensor) for t in a):
                inputs.append([layer(t) for t in a])
        self._inputs = inputs
        self.output_index = None

    def op_layer(self, module: str) -> int | None:
        """The layer of the op running now (between `set_inputs` and `op_done`): the running block's; outside
        the blocks, its inputs' (as `on_alloc` tags what it allocates)."""
        here = self.layer_of(module)
        return here if here is not None else self._provenance()

    def op_done(self) -> None:
        self._inputs = []
        self.output_index = None

    def _provenance(self) -> int | None:
        found = set()
        for x in self._inputs:
            if isinstance(x, list):
                i = self.output_index
                if i is not None and i < len(x):
                    found.add(x[i])
                elif i is None:
                    found.update(x)
            else:
                found.add(x)
        found.discard(None)
        return found.pop() if len(found) == 1 else None

    def on_alloc(self, block: int, module: str) -> int | None:
        """A new block: its layer (the running block's; outside the blocks, its inputs'); returns the event's."""
        here = self.layer_of(module)
        # outside the blocks, its inputs' layer: also in a module outside them, whose scope autograd's own
        # ops (accumulating a block's gradient at the end of backward) inherit
        self.block_layer[block] = here if here is not None else self._provenance()
        return here

    def _one_each(self, units: list[int]) -> bool:
        """Whether storages freed in a run, by the unit each was freed after, are one per block, or in units of
        several blocks (a cache's counter for each sliding-window block only), as many in every unit after the
        first (the first unit's blocks may be other kinds)."""
        if sorted(units) == self._every_block:
            return True
        if self.units == ONE:
            return False
        per_unit = [units.count(u) for u in range(1, self.count)]
        return 0 in units and min(per_unit) >= 1 and len(set(per_unit)) == 1

    def _made_per_block(self, raw_events, made: dict) -> None:
        """Units of several kinds: storages made one after another outside the blocks, from no block's input, alike
        (same phase, module, op), as many as the blocks of one kind and more than the units, are those blocks', in
        order (a cache's position counter for each sliding-window block, made before the blocks run: freed all
        together where the model's output keeps the cache, so that the frees' sweep below does not find them). A
        wrong pairing (a few alike storages that happen to be as many) fails the 4-unit check: traced whole."""
        kinds = self.kinds
        by_kind = {k: [b for b, kb in enumerate(kinds) if kb == k] for k in set(kinds)}
        run: list[int] = []
        for e in list(raw_events) + [("end", None, None, "", "", None)]:
            if run and (e[0] != "alloc" or e[5] is not None or made.get(e[1]) != made[run[0]]
                        or self.block_layer.get(e[1]) is not None):
                owners = [blocks for blocks in by_kind.values() if len(blocks) == len(run)]
                if len(run) > self.count and len(owners) == 1:  # one kind has that many blocks
                    self.block_layer.update({s: self.units.unit_of(b) for s, b in zip(run, owners[0])})
                run = []
            if e[0] == "alloc" and e[5] is None and e[1] in self.block_layer and self.block_layer[e[1]] is None:
                run.append(e[1])

    def finish(self, raw_events) -> EventLayers:
        """Each event's layer: the block running when it happened, else the layer of its storage. In a run of
        frees, storages made alike (same op, same module), outside the blocks from no block's input, in the
        run's phase, each freed right after one block's storage, one for every block (or as many for every unit),
        are those blocks':
        per-block objects freed together (a KV cache's layers, each with its position counter: Mistral's
        sliding-window cache, at the end of the forward)."""
        made = {e[1]: (e[2], e[3], e[4]) for e in raw_events if e[0] == "alloc"}  # storage -> phase, module, op
        if self.kinds is not None:
            self._made_per_block(raw_events, made)
        run: dict[tuple, dict[int, int]] = {}  # how made -> storage -> the block freed right before it
        phase = before = None  # the run's phase; the layer of the free before, in this run
        for e in list(raw_events) + [("end", None, None, "", "", None)]:
            if e[0] != "free" or e[2] != phase:
                for alike in run.values():
                    if self._one_each(list(alike.values())):
                        self.block_layer.update(alike)
                run, phase, before = {}, e[2], None
                if e[0] != "free":
                    continue
            layer = e[5] if e[5] is not None else self.block_layer.get(e[1])
            how = made.get(e[1])
            if layer is None and before is not None and e[1] in self.block_layer and how and how[0] == e[2]:
                run.setdefault(how, {})[e[1]] = layer = before
            before = layer
        out = [here if here is not None else self.block_layer.get(e[1]) for e in raw_events for here in (e[5],)]
        return EventLayers(self.prefixes, self.count, out, dict(self.block_layer), self.units)
