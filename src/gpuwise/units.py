"""Parsing and formatting of sizes and durations: the one place human strings come from."""

from __future__ import annotations

import re

from .errors import GpuwiseError

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "ki": 1024, "kib": 1024, "mi": 1024**2, "mib": 1024**2, "gi": 1024**3, "gib": 1024**3,
    "ti": 1024**4, "tib": 1024**4,
}
_DURATION_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
MIB = 1024**2
GIB = 1024**3


def parse_bytes(text: str | int | float) -> int:
    """'10GiB' -> 10737418240, '500MB' -> 500000000, '8g' -> 8e9 (decimal), a bare number is bytes."""
    if isinstance(text, (int, float)):
        return int(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise GpuwiseError(f"cannot read {text!r} as a size: use e.g. 10GiB, 500MiB, 8GB or a number of bytes")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def parse_duration(text: str | int | float) -> float:
    """'10m' -> 600.0, '30s' -> 30.0, '1.5h' -> 5400.0, a bare number is seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _DURATION_UNITS:
        raise GpuwiseError(f"cannot read {text!r} as a duration: use e.g. 30s, 10m, 1h or a number of seconds")
    return float(m.group(1)) * _DURATION_UNITS[m.group(2).lower()]


def fmt_bytes(n: int | float | None) -> str:
    """Binary units, three significant figures: 1536 -> '1.50 KiB'."""
    if n is None:
        return "-"
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" or n >= 100 else f"{sign}{n:.3g} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    if seconds < 120:
        return f"{seconds:.2f} s"
    return f"{seconds / 60:.1f} min"


def fmt_count(n: float | None, unit: str = "") -> str:
    """SI prefixes for counts: 1.2e12 FLOP -> '1.20 T'."""
    if n is None:
        return "-"
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {prefix}{unit}"
    return f"{n:.3g} {unit}".rstrip()
