"""How a figure's axes and words say their numbers: memory in the unit that fits, plain tick labels, and a
suite's labels filled in from the data drawn.

- A memory row is in GiB, MiB or KiB, the largest unit in which its largest value is at least 1, so that a
  decode step's 40 KiB is not "4e-05 GiB".
- A log axis is labelled with plain numbers (``0.1``, ``1``, ``10``; ``2`` and ``5`` between them where it spans at
  most two decades), never ``10⁻⁵`` or ``6×10⁻²``.
- A suite's ``title`` and ``[plot] x_label`` may name a parameter in braces (``of {kv_len} cached``): the figure
  says the values its rows have (``of 128K cached``), so that a run with ``--set kv_len=16384`` is not labelled
  with the suite's own size.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from topk_bench.report.plots.style import format_size
from topk_bench.results.columns import Metric
from topk_bench.units import GIB, KIB, MIB

_BYTE_UNITS = (("GiB", GIB), ("MiB", MIB), ("KiB", KIB))


def fitted(m: Metric, values: np.ndarray) -> tuple[Metric, float]:
    """``m`` in the byte unit that fits ``values`` (its values in ``m``'s unit) and the factor to get there; any
    other metric as it is, factor 1."""
    if m.unit not in dict(_BYTE_UNITS):
        return m, 1.0
    finite = np.abs(values[np.isfinite(values)]) * (dict(_BYTE_UNITS)[m.unit])
    largest = float(finite.max()) if finite.size else float(GIB)
    unit, size = next(((u, s) for u, s in _BYTE_UNITS if largest >= s), _BYTE_UNITS[-1])
    factor = dict(_BYTE_UNITS)[m.unit] / size
    label = m.label.replace(f"({m.unit})", f"({unit})")
    return Metric(m.name, m.column, m.scale * factor, label, unit, m.minus), factor


def in_bytes(value: float, unit: str) -> float | None:
    """``value`` of a byte ``unit`` (``GiB``...) in bytes; None for any other unit."""
    size = dict(_BYTE_UNITS).get(unit)
    return value * size if size is not None else None


def plain(value: float) -> str:
    """A tick's number as a reader writes it: ``0.001``, ``0.5``, ``20``, ``1e+06`` only past a million."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else ""
    if 1e-4 <= abs(value) < 1e6:
        return f"{value:.6f}".rstrip("0").rstrip(".") if abs(value) < 1 else f"{value:g}"
    return f"{value:.0e}"


def plain_log_ticks(axis) -> None:
    """Plain labels on a log ``axis`` (``ax.yaxis``): the decades, and 2 and 5 between them when it spans at
    most two decades."""
    low, high = axis.get_view_interval()
    axis.set_major_locator(LogLocator(base=10))
    axis.set_major_formatter(FuncFormatter(lambda v, _: plain(v)))
    if low > 0 and high / low <= 100:
        axis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
        axis.set_minor_formatter(FuncFormatter(lambda v, _: plain(v)))
    else:
        axis.set_minor_formatter(NullFormatter())


_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def filled(text: str, rows: pd.DataFrame) -> str:
    """``text`` with each ``{column}`` replaced by the values ``rows`` have there: one value as a size (``128K``),
    several as their range (``1K to 64K``) or list; a name no column has stays as written."""

    def values(match: re.Match) -> str:
        name = match.group(1)
        if name not in rows.columns:
            return match.group(0)
        present = rows[name].dropna().unique()
        if not len(present):
            return match.group(0)
        numbers = pd.to_numeric(pd.Series(present), errors="coerce")
        if numbers.notna().all():
            low, high = numbers.min(), numbers.max()
            return _size(low) if low == high else f"{_size(low)} to {_size(high)}"
        return ", ".join(str(v) for v in present)

    return _PLACEHOLDER.sub(values, text)


def _size(value: float) -> str:
    return format_size(int(value)) if float(value).is_integer() else f"{value:g}"
