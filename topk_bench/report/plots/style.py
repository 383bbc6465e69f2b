"""Visual identity of the figures: one colour and marker per implementation, units, tick labels.

Keyed by implementation name (the CSV's ``impl`` column), so that top-k is the
same orange square in every figure, as in the paper where a reader follows one
curve across Fig. 1, 2 and 3.

One meaning per encoding: colour and marker shape say which implementation, the
line's dashes which of its variants (top-64 beside top-128); markers are always
filled, because a hollow marker means one thing only: a time measured under
contention (:mod:`topk_bench.report.plots.figure`).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from topk_bench.status import Status

# Fixed for the paper's implementations; the paper draws top-k in orange.
# Their order is the legend's: baselines, then the paper's method and its variants.
_KNOWN = {
    "vanilla": ("#1f77b4", "o"),
    "qchunk": ("#2ca02c", "^"),
    "topk": ("#ff7f0e", "s"),
    "topk_sparse": ("#8c564b", "P"),
    "topk_fast": ("#e377c2", "*"),
    "performer": ("#d62728", "d"),
    "sdpa": ("#9467bd", "v"),
}
# Implementations registered later (plugins) get a stable pick from these.
_SPARE_COLOURS = ("#17becf", "#bcbd22", "#7f7f7f", "#393b79", "#637939", "#843c39", "#7b4173")
# Shapes no known implementation uses ("X" is the failure cross).
_SPARE_MARKERS = ("h", "p", "<", ">", "8", "H", "D")

# Second, third... series of the same implementation (e.g. top-64 and top-128)
# keep its colour and marker and differ by line style.
_VARIANT_DASHES = (None, (5, 2), (2, 1.5), (6, 2, 1, 2), (1, 1))

# How a failed point is drawn and annotated.
FAILURE_MARKER = "X"
FAILURE_TEXT: dict[str, str] = {  # looked up by a CSV cell's status
    Status.OOM: "OOM",
    Status.OVER_BUDGET: "over budget",
    Status.TIMEOUT: "timeout",
    Status.CRASHED: "crashed",
    Status.ERROR: "error",
    Status.NONFINITE: "NaN/inf",
}


@dataclass(frozen=True)
class SeriesStyle:
    colour: str
    marker: str
    dashes: tuple[float, ...] | None  # None: solid line


def impl_style(impl: str) -> tuple[str, str]:
    """Colour and marker of an implementation, identical in every figure."""
    if impl in _KNOWN:
        return _KNOWN[impl]
    digest = int(hashlib.sha256(impl.encode()).hexdigest(), 16)
    return _SPARE_COLOURS[digest % len(_SPARE_COLOURS)], _SPARE_MARKERS[digest % len(_SPARE_MARKERS)]


def impl_rank(impl: str) -> int:
    """Legend order: the paper's implementations first, in a fixed order."""
    order = list(_KNOWN)
    return order.index(impl) if impl in order else len(order)


def series_style(impl: str, variant: int) -> SeriesStyle:
    """Style of the ``variant``-th series of ``impl`` in a figure: its colour and marker, dashes by variant.
    (A figure is all measured or all predicted, and its title says which: dashes do not say it.)"""
    colour, marker = impl_style(impl)
    return SeriesStyle(colour, marker, _VARIANT_DASHES[variant % len(_VARIANT_DASHES)])


def format_size(value: float) -> str:
    """Tick label of a size: 512, 1K, 64K (binary K, as sizes are powers of two)."""
    if value >= 1024 and value % 1024 == 0:
        return f"{int(value) // 1024}K"
    return f"{value:g}"


def format_power_of_two(value: float) -> str:
    """Tick label as the paper writes chunk sizes: 2^9."""
    exponent = math.log2(value)
    return f"$2^{{{exponent:g}}}$" if exponent == int(exponent) else f"{value:g}"
