"""Units and how numbers are shown: bytes in binary units, seconds."""

from __future__ import annotations

import re
import textwrap
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


def three_digits(value: float) -> str:
    """Three significant digits, trailing zeros kept, never an exponent: ``0.978``, ``7.70``, ``36.5``, ``512``."""
    if value == 0:
        return "0"
    for digits, below in ((2, 9.995), (1, 99.95)):
        if abs(value) < below:
            return f"{value:#.3g}" if abs(value) < 0.9995 else f"{value:.{digits}f}"
    return f"{value:.0f}"


def _scaled(value: float, units: tuple[tuple[str, float], ...], space: str) -> str:
    """``value`` in the smallest of ``units`` (ascending) in which it stays below 1000."""
    for unit, size in units:
        if abs(value) / size < 999.5 or unit == units[-1][0]:
            return f"{three_digits(value / size)}{space}{unit}"
    raise AssertionError("unreachable")


def short_bytes(value: Any, space: str = " ") -> str:
    """``7.70 GiB``, ``0.978 GiB``, ``512 MiB``, ``12.0 KiB``, ``0 B``: three digits, the unit changing before a
    value needs four (never ``1001 MiB``), so that a column of them reads alike; ``-`` for a missing value."""
    if missing(value):
        return "-"
    n = float(value)
    if abs(n) < 999.5:
        return f"{n:.0f}{space}B"
    return _scaled(n, (("KiB", KIB), ("MiB", MIB), ("GiB", GIB)), space)


def short_seconds(value: Any, space: str = " ") -> str:
    """``812 us``, ``12.3 ms``, ``1.23 s``, ``1234 s``: three digits (four from 1000 s); ``-`` for a missing
    value."""
    if missing(value):
        return "-"
    return _scaled(float(value), (("us", 1e-6), ("ms", 1e-3), ("s", 1.0)), space)


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


# A number and the unit or noun after it (``12 min``, ``36.5 GiB``, ``24 cases``): never broken apart by a wrap.
_UNITS = r"[KMGT]i?B|B|[mµu]?s|ns|min|h|d|%|x|case|row|line|core|thread|job"
_NUMBER_AND_UNIT = re.compile(rf"(?<![\w.])(\d[\d,.]*(?:e[+-]?\d+)?)[ ](?=(?:{_UNITS})\w*\b)")
_KEPT = "\u00a0"  # textwrap breaks at ASCII whitespace only


def wrap(text: str, width: int, *, break_long_words: bool = True) -> list[str]:
    """``textwrap.wrap(text, width)``'s lines (at whitespace, not at hyphens), in time linear in ``text``'s length:
    textwrap breaks a word longer than the width by slicing the rest of it once per line, quadratic in the word
    (a 10 MB label took minutes); here such a word is cut into pieces of the width first, each on a line of its
    own. ``break_long_words=False``: a long word stays whole on its line (a path)."""
    width = max(1, width)
    if break_long_words and len(text) > width:
        text = re.sub(
            rf"\S{{{width + 1},}}",
            lambda m: " ".join(m.group()[i : i + width] for i in range(0, len(m.group()), width)),
            text,
        )
    return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)


def wrapped(text: str, width: int) -> str:
    """``text`` wrapped to ``width`` columns at spaces, never between a number and its unit; a word longer than
    the width stays whole (a path)."""
    glued = _NUMBER_AND_UNIT.sub(lambda m: m.group(1) + _KEPT, text)
    lines = wrap(glued, width, break_long_words=False) or [""]
    return "\n".join(lines).replace(_KEPT, " ")
