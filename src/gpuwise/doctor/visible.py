"""CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER as CUDA reads them: which nvidia-smi GPU becomes `cuda:k`.

CUDA's rules (NVIDIA, CUDA C++ Programming Guide, "CUDA Environment Variables"): the value is a comma-
separated list of integer indices or (prefixes of) GPU/MIG UUIDs; devices are enumerated in the list's
order; at the first invalid entry the list ends (only the entries before it are visible). Indices are
CUDA's own enumeration, which is `CUDA_DEVICE_ORDER`: `FASTEST_FIRST` (the default) "causes CUDA to
guess which device is fastest using a simple heuristic, and make that device 0, leaving the order of
the rest of the devices unspecified"; `PCI_BUS_ID` orders by PCI bus id, which is nvidia-smi's/NVML's
order. PyTorch's own parser (torch/cuda/__init__.py `_parse_visible_devices`) adds: a repeated entry
makes the whole list empty, and a list that starts with UUIDs ends at the first index (and vice versa).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..devices.model import Gpu
from ..plan.catalog import tensor_core_capability


@dataclass(frozen=True)
class VisibleDevices:
    """The parsed value: the GPUs CUDA will show as cuda:0, cuda:1, ... and what is wrong with it."""

    value: str | None
    visible: list[Gpu] = field(default_factory=list)  # in cuda:k order
    problems: list[str] = field(default_factory=list)
    kind: str = "unset"  # unset | empty | index | uuid | mig | mixed


def _kind(token: str) -> str:
    if token.isdigit():
        return "index"
    if token.startswith("GPU-"):
        return "uuid"
    if token.startswith("MIG-"):
        return "mig"
    return "invalid"


def fastest_first(gpus: list[Gpu]) -> list[Gpu]:
    """gpuwise's guess at CUDA's FASTEST_FIRST order: higher compute capability first, PCI order among
    equals. CUDA documents only that device 0 is the one its heuristic finds fastest; identical GPUs
    keep PCI order in practice. The guess is only used where torch could not report the real order."""
    def key(g: Gpu):
        return tuple(-c for c in (tensor_core_capability(g.name) or (0, 0)))

    return sorted(gpus, key=key)  # stable: ties keep NVML (PCI) order


def cuda_order(gpus: list[Gpu], device_order: str | None) -> list[Gpu]:
    """All GPUs in CUDA's enumeration order for this CUDA_DEVICE_ORDER."""
    ordered = sorted(gpus, key=lambda g: g.index)
    return ordered if (device_order or "").strip() == "PCI_BUS_ID" else fastest_first(ordered)


def parse(value: str | None, gpus: list[Gpu], device_order: str | None = None) -> VisibleDevices:
    """Which of `gpus` (NVML snapshots) CUDA shows, in order, for this CUDA_VISIBLE_DEVICES value."""
    order = cuda_order(gpus, device_order)
    if value is None:
        return VisibleDevices(None, order, [], "unset")
    tokens = [t.strip() for t in value.split(",")]
    if not any(tokens):
        return VisibleDevices(value, [], [f"CUDA_VISIBLE_DEVICES={value!r} is set but empty: CUDA shows no GPU"], "empty")
    problems: list[str] = []
    kinds = {_kind(t) for t in tokens if t}
    kind = kinds.pop() if len(kinds) == 1 else "mixed"
    dups = sorted({t for t in tokens if t and tokens.count(t) > 1})
    if dups:
        problems.append(f"{', '.join(dups)} repeated: PyTorch treats a list with a repeated entry as empty "
                        "(no GPU)")
    visible: list[Gpu] = []
    first_kind = _kind(tokens[0])
    for pos, token in enumerate(tokens):
        if "invalid" not in (first_kind, _kind(token)) and _kind(token) != first_kind:
            problems.append(f"mixes indices and UUIDs: PyTorch's parser ends the list at {token!r} (entry {pos + 1}), so "
                            f"{', '.join(tokens[pos:])} {'is' if len(tokens) - pos == 1 else 'are'} hidden")
            break
        match, why = _resolve(token, order)
        if match is None and why is None:
            continue  # a MIG instance: visible, but not a whole GPU to map
        if match is None:
            problems.append(f"{token!r} (entry {pos + 1}) {why}: CUDA stops there, so "
                            f"{', '.join(tokens[pos:])} {'is' if len(tokens) - pos == 1 else 'are'} hidden")
            break
        visible.append(match)
    if dups:
        visible = []
    return VisibleDevices(value, visible, problems, kind)


def _resolve(token: str, order: list[Gpu]) -> tuple[Gpu | None, str | None]:
    """(gpu, None), (None, why-invalid) or (None, None) for a MIG instance."""
    kind = _kind(token)
    if not token:
        return None, "is empty"
    if kind == "index":
        i = int(token)
        if i >= len(order):
            return None, f"is not a GPU index (this machine has {len(order)} GPU{'s' if len(order) != 1 else ''}: 0-{len(order) - 1})" \
                if order else "is not a GPU index (no GPU found)"
        return order[i], None
    if kind == "uuid":
        hits = [g for g in order if g.uuid.startswith(token)]
        if len(hits) == 1:
            return hits[0], None
        return None, "matches no GPU's UUID" if not hits else f"matches {len(hits)} GPUs' UUIDs (too short a prefix)"
    if kind == "mig":
        return None, None
    return None, "is neither an index nor a GPU-/MIG- UUID"


@dataclass(frozen=True)
class MappingRow:
    cuda_index: int
    token: str
    pci_bus_id_order: Gpu | None     # the GPU with CUDA_DEVICE_ORDER=PCI_BUS_ID
    fastest_first_order: Gpu | None  # the GPU with CUDA's default order (gpuwise's guess, see fastest_first)

    def to_dict(self) -> dict:
        def g(x: Gpu | None):
            return None if x is None else {"index": x.index, "name": x.name, "uuid": x.uuid, "pci_bus_id": x.pci_bus_id}
        return {"cuda_index": self.cuda_index, "token": self.token, "with_pci_bus_id": g(self.pci_bus_id_order),
                "with_fastest_first": g(self.fastest_first_order)}


def mapping(value: str | None, gpus: list[Gpu]) -> list[MappingRow]:
    """cuda:k -> nvidia-smi GPU, under both orders (the seeds' `CUDA_VISIBLE_DEVICES=0,4` question)."""
    pci = parse(value, gpus, "PCI_BUS_ID").visible
    fast = parse(value, gpus, "FASTEST_FIRST").visible
    tokens = [t.strip() for t in value.split(",")] if value is not None else [str(i) for i in range(len(gpus))]
    rows = []
    for k in range(max(len(pci), len(fast))):
        rows.append(MappingRow(k, tokens[k] if k < len(tokens) else "?", pci[k] if k < len(pci) else None,
                               fast[k] if k < len(fast) else None))
    return rows
