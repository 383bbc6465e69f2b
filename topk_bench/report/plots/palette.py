"""One colour and one marker per implementation, in every figure, keyed by its registry name.

A reader follows one method across figures, as across the paper's Fig. 1, 2 and 3: top-k is the orange square
in ``mha``, ``paper_mha``, ``decoder`` and ``kv_selection`` alike. An implementation written as the authors'
code (``vanilla_paper``) is a variant of the method it reproduces (``vanilla``): its colour, its marker, a dashed
line. Several curves of one implementation in a figure (top-64 beside top-128, batch 1 beside batch 8) differ by
shade and line style; the legend's handles are long enough to draw the dashes. Markers are always filled: a
hollow one means a time measured under contention, nothing else (:mod:`topk_bench.report.plots.marks`).

An implementation no one listed here (a plug-in's) gets a colour and marker of its own from its name, stable
from run to run, never one of these.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import matplotlib.colors as mcolors

# Every method the project registers (tests/report/test_figures_read_alike.py holds the registry to it). The
# legend's order: baselines, the paper's method and its variants, the KV-cache selection methods, then the
# trained sparse attentions (DSA, NSA).
KNOWN: dict[str, tuple[str, str]] = {
    "vanilla": ("#1f77b4", "o"),
    "qchunk": ("#2ca02c", "^"),
    "topk": ("#ff7f0e", "s"),
    "topk_sparse": ("#8c564b", "P"),
    "topk_fast": ("#e377c2", "*"),
    "performer": ("#d62728", "d"),
    "sdpa": ("#9467bd", "v"),
    "page_topk": ("#7b4173", "D"),
    "sink_window": ("#637939", "h"),
    "block_topk": ("#17becf", "p"),
    "dsa": ("#10a674", ">"),
    "nsa": ("#a50055", "8"),
    "flex": ("#7f7f7f", "<"),
}
# A registry name ending so is a variant of the method before it (``vanilla_paper``: the authors' vanilla).
VARIANT_SUFFIXES = ("_paper",)
# Implementations registered by plug-ins get a stable pick from these (none taken above; "X" is the failure cross;
# the project's methods take every other filled marker).
SPARE_COLOURS = ("#bcbd22", "#393b79", "#843c39", "#e7969c", "#6b6ecf", "#b5cf6b", "#8c6d31")
SPARE_MARKERS = ("H",)

# The n-th variant of a method in a figure: a shade of its colour (< 0 towards black, > 0 towards white) and dashes.
SHADES = (0.0, -0.4, 0.4, -0.6, 0.55)
DASHES: tuple[tuple[float, ...] | None, ...] = (None, (4, 1.5), (1.2, 1.2), (5, 1.5, 1.2, 1.5), (2.5, 2.5))
# Legend handles this many font sizes long: two periods of every dash pattern above fit (matplotlib's 2 do not).
HANDLE_LENGTH = 3.6


@dataclass(frozen=True)
class SeriesStyle:
    colour: str
    marker: str
    dashes: tuple[float, ...] | None  # None: solid line


def method(impl: str) -> str:
    """The method an implementation is a variant of (``vanilla_paper`` -> ``vanilla``), else itself."""
    for suffix in VARIANT_SUFFIXES:
        base = impl.removesuffix(suffix)
        if base != impl and base in KNOWN:
            return base
    return impl


def variant_rank(impl: str) -> int:
    """0 for a method itself, 1 for its authors' code: how many line styles from the method's its own is."""
    return 0 if method(impl) == impl else 1


def impl_style(impl: str) -> tuple[str, str]:
    """Colour and marker of an implementation, identical in every figure: its method's (the authors' code of a
    method differs by its line, :func:`series_style`)."""
    base = method(impl)
    if base in KNOWN:
        return KNOWN[base]
    digest = int(hashlib.sha256(impl.encode()).hexdigest(), 16)
    return SPARE_COLOURS[digest % len(SPARE_COLOURS)], SPARE_MARKERS[digest % len(SPARE_MARKERS)]


def impl_rank(impl: str) -> tuple[int, int]:
    """Legend order: the known methods first, in a fixed order, each followed by its variants."""
    order = list(KNOWN)
    base = method(impl)
    return (order.index(base) if base in order else len(order), variant_rank(impl))


def shade(colour: str, amount: float) -> str:
    """``colour`` moved towards black (``amount`` < 0) or white (> 0) by that share."""
    if not amount:
        return colour
    target = 0.0 if amount < 0 else 1.0
    r, g, b = (c + (target - c) * abs(amount) for c in mcolors.to_rgb(colour))
    return mcolors.to_hex((r, g, b))


def series_style(impl: str, variant: int) -> SeriesStyle:
    """Style of the ``variant``-th curve of ``impl`` in a figure: its colour and marker; its curves after the
    first in other shades; dashes by variant, counted after the implementation's own line (the authors' vanilla
    is vanilla's colour, dashed)."""
    colour, marker = impl_style(impl)
    return SeriesStyle(
        shade(colour, SHADES[variant % len(SHADES)]), marker, DASHES[(variant + variant_rank(impl)) % len(DASHES)]
    )
