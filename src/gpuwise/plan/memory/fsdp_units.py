"""FSDP's units and what it holds unsharded: which parameters FSDP2 gathers as one unit, and how many bytes.

`fsdp_units` / `fsdp_units_of` find a model's units (the root group outside the repeated blocks, the largest
block, the blocks' ModuleList) on the meta device; `block_param_bytes` guesses a block's bytes from a trace
when the model's units are unknown; `fsdp_gathered_pieces` the tensors FSDP2 holds beyond the shards in
each phase of the step; `flat_root_gradient_bytes` FSDP1's root flat
gradient under accumulation; `unit_of` and `backward_units` which block unit a traced event is in.
plan/memory/sharding.py places these in a rank's events.
"""

from __future__ import annotations

from typing import NamedTuple

from .events import MemEvent, MemoryTrace, Peak, live_peak

FSDP_BLOCKS_IN_FLIGHT = 2  # the block in use and the one prefetched (FSDP2 implicit prefetching)


def block_param_bytes(trace: MemoryTrace, layers: int | None = None, peak: Peak | None = None) -> int:
    """The FSDP unit: a model config's parameters at the peak over its `layers` blocks; a model that is
    not a config: an eighth of them (the largest module's, guessed). `peak`: `live_peak(trace)` when the
    caller has it."""
    params = (peak or live_peak(trace)).by_category.get("parameters", 0)
    return max(params // (layers or 8), 0)


class FsdpUnits(NamedTuple):
    root: float          # share of the parameters outside the repeated blocks (FSDP2's root group)
    after: float         # of those, outside nn.Embedding: taken to run after the blocks
    block: float         # share of the largest block
    blocks_paths: tuple[str, ...]  # dotted paths of the blocks' ModuleLists (("model.layers",); an encoder-decoder's two)


def block_lists(model) -> list[tuple[str, object]]:
    """The ModuleLists whose children FSDP shards one by one, with their dotted paths: the largest (the
    transformer layers), and every other list outside it holding at least a quarter of its parameters (an
    encoder-decoder's encoder, beside its decoder: the blocks PyTorch's T5 example wraps by their class). Lists
    inside a chosen one (a block's experts) are not."""
    import torch

    lists = [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    if not lists:
        return []
    size = {id(m): sum(p.numel() for p in m.parameters()) for _, m in lists}
    biggest = max(lists, key=lambda nm: size[id(nm[1])])
    chosen = [biggest]
    for name, m in lists:
        inside = any(name.startswith(c + ".") or c.startswith(name + ".") for c, _ in chosen)
        if m is not biggest[1] and not inside and 4 * size[id(m)] >= size[id(biggest[1])]:
            chosen.append((name, m))
    return chosen


def fsdp_units(model) -> FsdpUnits | None:
    """The shares of `model`'s parameters that FSDP2 gathers as one unit: (the root's own parameters, i.e.
    everything outside the repeated blocks -- embeddings, final norm, LM head --; those of them outside
    `nn.Embedding`, taken to run after the blocks so that their gradients exist through the blocks'
    backward; one block); None without repeated blocks. `gpuwise train` shards each child of the
    `block_lists`, then the root (scaleout/fsdp.py `shard`); `model` may be on the meta device."""
    import torch

    lists = block_lists(model)
    total = sum(p.numel() for p in model.parameters())
    if not lists or not total:
        return None
    in_blocks = {id(p) for _, blocks in lists for p in blocks.parameters()}
    embedded = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    root = sum(p.numel() for p in model.parameters() if id(p) not in in_blocks)
    after = sum(p.numel() for p in model.parameters() if id(p) not in in_blocks and id(p) not in embedded)
    largest = max(sum(p.numel() for p in b.parameters()) for _, blocks in lists for b in blocks)
    return FsdpUnits(root / total, after / total, largest / total, tuple(name for name, _ in lists))


def fsdp_units_of(workload) -> FsdpUnits | None:
    """`fsdp_units` of the workload's model, built on the meta device (no memory); None when it cannot be."""
    import torch

    try:
        with torch.device("meta"):
            model = workload.model_fn()
        return fsdp_units(model)
    except Exception:  # a model that cannot be built on meta: every block is the average (rank_trace)
        return None


def fsdp_gathered_pieces(param_bytes: int, units: FsdpUnits, n: int,
                         device_type: str, root_grads: bool = True, block_grads: bool = True,
                         reduce_factor: int = 1, accumulate_shards: bool = False) -> dict[str, tuple[int, ...]]:
    """The tensors FSDP2 holds beyond the shards, by phase, each its own allocation (a unit's gathered
    parameters, its unsharded gradients, its reduce-scatter input and output: FSDP allocates each on its own,
    so the caching allocator places each on its own) (torch 2.x `_fully_shard/_fsdp_param_group.py`
    `pre_forward` / `pre_backward` / `post_backward`, `_fsdp_collectives.py` `foreach_reduce`):
      forward: the root's gathered parameters (all-gathered in the root's pre-forward) + the block in use
        and the one prefetched;
      backward, by where it is in the blocks (L of them, run last to first): throughout, the root's
        parameters (resharded after forward, gathered again in its pre-backward) and the unsharded
        gradients of its parameters that ran after the blocks (LM head, final norm), kept until the
        root's reduce-scatter at the end; and
        `backward_head` (the head's backward): the last block, prefetched in the root's pre-backward;
        `backward_first` (block L-1): that block, the next one prefetched, its unsharded gradients;
        `backward` (a middle block): the same + the previous block's reduce-scatter input (kept until the
          next reduce: `reduce_scatter_max_input_buffers` = 1, freed in `post_backward_rs_wait`);
        `backward_last` (block 0): the block, its gradients, the previous input (nothing to prefetch);
        `backward_only` (the block of a one-block model): the block and its gradients;
        `backward_tail` (after the blocks: the embeddings' backward): block 0's reduce-scatter input;
      end of backward (a spike, the root's `post_backward` after its reshard): the root's unsharded
        gradients, still referenced while `foreach_reduce` copies them into the reduce-scatter input
        (root-sized); on gloo (the CPU target) gloo's `_reduce_scatter_base` clones its input and the
        shard is allocated (measured with the profiler on 2 gloo ranks: + root / N at the root's reduce).
    Measured per phase on 2 gloo ranks (small / hidden-1024 Llama, frees on gloo's threads counted).
    With frozen parameters (LoRA): `root_grads=False` (embeddings and head frozen: no head gradients, no
    root reduce-scatter), `block_grads=False` (FSDP2: a block's frozen parameters get no gradient, its
    adapters' are negligible; FSDP1's flat parameters do get them: True). `reduce_factor`: a reduce-scatter
    input's bytes over the gradient's (2: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), whose
    `foreach_reduce` copies the bf16 gradients into an fp32 input).
    `accumulate_shards`: a micro-step after the first that reduce-scatters (accumulation, `--accum-sync
    every`): a sharded gradient already exists, so each unit's reduce-scatter output (its input / N) is a
    buffer of its own, added into it and then freed (FSDP1 `_reduce_grad` -> `_accumulate_sharded_grad`:
    `_saved_grad_shard += new_sharded_grad`; FSDP2 `foreach_reduce`: `grad += new_sharded_grad`); without an
    accumulated gradient the output becomes the gradient. Measured on 2 gloo ranks (FSDP1, use_orig_params,
    accumulation 2-4 without no_sync): the peak at the root's reduce-scatter is the single step's + root / N."""
    root, after, block = (int(param_bytes * u) for u in units[:3])
    after = after if root_grads else 0
    grad = block if block_grads else 0  # a block's unsharded gradients
    rs = grad * reduce_factor  # ... and its reduce-scatter input
    out = -(-rs // n) if accumulate_shards else 0  # ... and its output, beside the accumulated shard
    end = _root_reduce_bytes(root, n, device_type, reduce_factor) if root_grads else 0
    if root_grads and accumulate_shards:
        end += -(-root * reduce_factor // n)
    blocks = (block,) * FSDP_BLOCKS_IN_FLIGHT
    pieces = {"forward": (root, *blocks),
              "backward_head": (root, after, block),
              "backward_first": (root, after, *blocks, grad),
              "backward": (root, after, *blocks, grad, rs, out),
              "backward_last": (root, after, block, grad, rs, out),
              "backward_only": (root, after, block, grad),
              "backward_tail": (root, after, rs, out),
              "end": (end,)}
    return {phase: tuple(p for p in held if p) for phase, held in pieces.items()}


def _root_reduce_bytes(root: int, n: int, device_type: str, reduce_factor: int) -> int:
    """The root's `foreach_reduce` (torch 2.x `_fsdp_collectives.py`): its unsharded gradients (`root`
    bytes) are copied into the reduce-scatter input (`root x reduce_factor`), then cleared; the output shard
    (input / n) is allocated after. On gloo (the CPU target) `_reduce_scatter_base` clones its input, so
    input, clone and shard are alive together."""
    rs = root * reduce_factor
    copy_in = root + rs
    return max(copy_in, 2 * rs + -(-rs // n)) if device_type == "cpu" else copy_in


def backward_units(events: list[MemEvent], blocks_paths: tuple[str, ...]) -> dict[int, tuple[str, str]]:
    """For each backward run (consecutive backward events, keyed by its first index): the first and the
    last block unit it reaches (`unit_at`)."""
    runs: dict[int, tuple[str, str]] = {}
    start, first, last = None, "", ""
    for i, e in enumerate([*events, None]):
        if e is not None and e.phase == "backward":
            if start is None:
                start, first, last = i, "", ""
            unit = unit_at(e.module, blocks_paths)
            if unit is not None:
                last = unit
                first = first or last
        elif start is not None:
            runs[start] = (first, last)
            start = None
    return runs


def unit_at(module: str, blocks_paths: tuple[str, ...]) -> str | None:
    """The block unit `module` is in ("<list path>.<index>"), None outside the blocks."""
    for path in blocks_paths:
        if module.startswith(path + "."):
            return path + "." + module[len(path) + 1:].split(".")[0]
    return None


def unit_of(module: str, blocks_paths: tuple[str, ...]) -> str | None:
    """The block unit ("<list path>.<index>") `module` is in, also under a wrapper's prefix (peft's
    `base_model.model.`); None outside the blocks."""
    for path in blocks_paths:
        at = f".{module}.".find(f".{path}.")
        if at >= 0:
            index = module[at + len(path) + 1:].split(".")[0]
            return path + "." + index if index else None
    return None


def flat_root_gradient_bytes(param_total: int, units: FsdpUnits, notes: list[str]) -> int:
    """FSDP1 accumulating without sync (`no_sync`): the root unit's flat gradient. With use_orig_params each
    parameter is a view of the unit's flat parameter (`_use_unsharded_views`: a split of it), so autograd
    forms the flat parameter's gradient in `SplitWithSizesBackward`, a root-sized `cat` of its parameters'
    gradients once the last of them (the embeddings', at the end of backward) exists, and adds it into the
    flat gradient accumulated over the micro-steps. Measured on 2 gloo ranks (FSDP1, use_orig_params=True,
    an embedding, 4 MLP blocks and an untied head, accumulation 2): the step's peak is that `cat`, with the
    head's and the embeddings' gradients alive; a first micro-step without an accumulated gradient takes the
    `cat` as the gradient (no extra)."""
    nbytes = int(param_total * units.root)
    notes.append(f"fsdp1 accumulating: + {nbytes} bytes at the end of backward (the root's flat gradient, a cat "
                 "of its parameters' gradients, added into the accumulated one)")
    return nbytes
