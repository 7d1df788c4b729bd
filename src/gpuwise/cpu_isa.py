"""Which instruction set oneDNN (PyTorch's CPU kernels for convolutions and low-precision matmuls) uses here.

oneDNN picks its kernels, and with them their scratch, reorders and weight layouts, by the best ISA the
CPU has, capped by `ONEDNN_MAX_CPU_ISA` (older name `DNNL_MAX_CPU_ISA`; oneDNN docs, "CPU dispatcher
control"). ATen's own vectorised kernels follow `torch.backends.cpu.get_cpu_capability()` (capped by
`ATEN_CPU_CAPABILITY`). Both are read at run time; nothing here is cached across processes.

Levels, lowest first, with the /proc/cpuinfo flags that make each (oneDNN src/cpu/x64/cpu_isa_traits.hpp):
"""

from __future__ import annotations

import os
from functools import lru_cache

# (oneDNN ISA name, cpuinfo flags all required): each level includes the ones before it
LEVELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("SSE41", ("sse4_1",)),
    ("AVX", ("avx",)),
    ("AVX2", ("avx2",)),
    ("AVX512_CORE", ("avx512f", "avx512bw", "avx512vl", "avx512dq")),
    ("AVX512_CORE_VNNI", ("avx512_vnni",)),
    ("AVX512_CORE_BF16", ("avx512_bf16",)),
    ("AVX512_CORE_FP16", ("avx512_fp16",)),          # oneDNN also calls it AVX10_1_512
    ("AVX512_CORE_AMX", ("amx_tile", "amx_bf16", "amx_int8")),  # AVX10_1_512_AMX
    ("AVX512_CORE_AMX_FP16", ("amx_fp16",)),          # AVX10_1_512_AMX_FP16
)
NAMES = tuple(name for name, _ in LEVELS)
# names ONEDNN_MAX_CPU_ISA accepts for the same levels
ALIASES = {"AVX10_1_512": "AVX512_CORE_FP16", "AVX10_1_512_AMX": "AVX512_CORE_AMX",
           "AVX10_1_512_AMX_FP16": "AVX512_CORE_AMX_FP16", "AVX2_VNNI": "AVX2", "AVX2_VNNI_2": "AVX2"}
__doc__ += "\n".join(f"  {name:22s} {' '.join(flags)}" for name, flags in LEVELS) + "\n"


def _rank(name: str) -> int:
    return NAMES.index(name)


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def hardware_isa(flags: frozenset[str] | None = None) -> str | None:
    """The highest oneDNN level the CPU has (None: not x86, or unknown)."""
    flags = cpu_flags() if flags is None else flags
    best = None
    for name, needs in LEVELS:
        if not all(f in flags for f in needs):
            break
        best = name
    return best


def max_isa_env(environ=None) -> str | None:
    """The cap set by ONEDNN_MAX_CPU_ISA (or DNNL_MAX_CPU_ISA), normalised; None when unset or ALL."""
    environ = os.environ if environ is None else environ
    value = (environ.get("ONEDNN_MAX_CPU_ISA") or environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    if not value or value in ("ALL", "DEFAULT"):
        return None
    value = ALIASES.get(value, value)
    return value if value in NAMES else None


def onednn_isa(flags: frozenset[str] | None = None, environ=None) -> str | None:
    """The ISA oneDNN dispatches to in this process: the CPU's best, capped by ONEDNN_MAX_CPU_ISA."""
    hw = hardware_isa(flags)
    cap = max_isa_env(environ)
    if hw is None or cap is None:
        return hw
    return NAMES[min(_rank(hw), _rank(cap))]


@lru_cache(maxsize=1)
def current() -> str | None:
    """`onednn_isa()` for this process (oneDNN reads its environment once, at its first kernel)."""
    return onednn_isa()


def at_least(level: str, isa: str | None = None) -> bool:
    """True when the ISA oneDNN uses (`isa`, default this process's) includes `level`."""
    isa = current() if isa is None else isa
    return isa is not None and _rank(isa) >= _rank(level)


def native_bf16(isa: str | None = None) -> bool:
    """bf16 arithmetic in hardware (AVX512-BF16 / AMX) on the path oneDNN uses."""
    return at_least("AVX512_CORE_BF16", isa)
