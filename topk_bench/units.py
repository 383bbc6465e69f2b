"""Units and how numbers are shown: bytes in binary units, seconds."""

from __future__ import annotations

from typing import Any

KIB = 2**10
MIB = 2**20
GIB = 2**30


def missing(value: Any) -> bool:
    """None, NaN or an empty cell."""
    return value is None or value == "" or (isinstance(value, float) and value != value)


def format_bytes(value: Any) -> str:
    """``1.5 GiB``, ``300 MiB``, ``12 B``; ``-`` for a missing value."""
    if missing(value):
        return "-"
    n = float(value)
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n) >= size:
            return f"{n / size:.4g} {unit}"
    return f"{n:.0f} B"


def format_seconds(value: Any) -> str:
    """``1.23 s``, ``45.6 ms``; ``-`` for a missing value."""
    if missing(value):
        return "-"
    s = float(value)
    return f"{s:.4g} s" if abs(s) >= 1 else f"{s * 1e3:.4g} ms"


def format_duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3.5 h``, ``11.6 d``: an estimate, so three digits at most."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.0f} s"
