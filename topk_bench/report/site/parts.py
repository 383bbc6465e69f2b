"""What the report page says of one suite's rows of one device and method, from one results folder: a
:class:`Part` (its pivot tables as ``show`` makes them, its figures as ``plot`` draws them, its trust flags, its
provenance, its roofline fractions and its crossovers).

A page must open fast whatever the files hold (100,000 rows): a table shows at most :data:`MAX_ROWS` rows and
:data:`MAX_COLUMNS` columns, the whole of it written beside the page as a CSV the page links to; a figure of more
than :data:`MAX_DRAWN_ROWS` rows is not drawn here (``topk-bench plot`` draws it), and the page says so.
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import pandas as pd

from topk_bench.report import crossovers as cross
from topk_bench.report.plots.inputs import FigureInput
from topk_bench.report.show import Grid, grid, grids
from topk_bench.results import columns as col
from topk_bench.results import trust
from topk_bench.results.store import spreadsheet_safe
from topk_bench.types import Method
from topk_bench.units import missing
from topk_bench.untrusted import abridged, shown

MAX_ROWS = 100
MAX_COLUMNS = 24
MAX_DRAWN_ROWS = 3000
# How many distinct values a provenance line lists before it counts the rest, and how long each may be.
LISTED = 8
VALUE_CHARACTERS = 300


@dataclass
class Table:
    """A table of the page: its ``rows`` the first :data:`MAX_ROWS` (cells may hold line breaks), ``csv`` the
    whole table's file (relative to the page) where some were left out, ``note`` what was."""

    anchor: str
    caption: str
    header: list[str]
    rows: list[list[str]]
    csv: str | None = None
    note: str = ""


@dataclass
class Figure:
    src: str  # relative to the page
    alt: str


@dataclass
class Part:
    """One suite's rows of one device and method from one results folder."""

    anchor: str
    suite: str
    device: str
    method: str
    source: str  # the results folder, as given
    rows: pd.DataFrame
    items: list[FigureInput]
    tables: list[Table] = field(default_factory=list)
    roofline: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    trust: str | None = None
    provenance: list[tuple[str, str]] = field(default_factory=list)
    crossovers: list[cross.Found] = field(default_factory=list)

    @property
    def title(self) -> str:
        return f"{self.device} · {self.method}"


@dataclass(frozen=True)
class CrossoverRow:
    """A method's line of the page's summary: where it wins in time and in memory."""

    name: str
    baseline: str
    length: str
    time: cross.Found | None
    memory: cross.Found | None


def crossover_rows(part: Part) -> list[CrossoverRow]:
    by_name: dict[str, dict[str, cross.Found]] = {}
    for found in part.crossovers:
        by_name.setdefault(found.name, {})[found.metric] = found
    return [
        CrossoverRow(name, first.baseline, first.length, metrics.get("time"), metrics.get("memory"))
        for name, metrics in by_name.items()
        for first in [next(iter(metrics.values()))]
    ]


def grid_table(pivot: Grid, anchor: str, caption: str) -> tuple[Table, str | None]:
    """The page's table of a pivot, and the whole pivot as CSV text where the page shows only part of it."""
    xs = pivot.xs[:MAX_COLUMNS]
    header = [pivot.x or "case", *xs]
    rows = [[name, *(pivot.cell(name, x) for x in xs)] for name in pivot.names[:MAX_ROWS]]
    left = []
    if len(pivot.names) > MAX_ROWS:
        left.append(f"the first {MAX_ROWS} of {len(pivot.names)} rows")
    if len(pivot.xs) > MAX_COLUMNS:
        left.append(f"the first {MAX_COLUMNS} of {len(pivot.xs)} columns")
    if not left:
        return Table(anchor, caption, header, rows), None
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([spreadsheet_safe(c) for c in [pivot.x or "case", *pivot.xs]])
    for name in pivot.names:
        writer.writerow(
            [spreadsheet_safe(c.replace("\n", " ")) for c in [name, *(pivot.cell(name, x) for x in pivot.xs)]]
        )
    note = f"Shown: {' and '.join(left)}; the whole table:"
    return Table(anchor, caption, header, rows, f"tables/{anchor}.csv", note), buffer.getvalue()


def part_tables(part: Part) -> list[tuple[Table, str | None]]:
    """The pivot tables of the part: ``show``'s (one per model where a suite has several)."""
    out = []
    for index, (_, caption, rows) in enumerate(grids(part.rows)):
        pivot = grid(rows)
        what = f"{pivot.what} by {pivot.x or 'case'}"
        out.append(grid_table(pivot, f"{part.anchor}-table-{index}", f"{caption} · {what}" if caption else what))
    return out


def roofline_tables(part: Part) -> list[tuple[Table, str | None]]:
    """roofline_frac (the row's time at the device's peaks over its time) as a pivot, where the rows have it."""
    if col.ROOFLINE_FRAC not in part.rows.columns:
        return []
    rows = part.rows[pd.to_numeric(part.rows[col.ROOFLINE_FRAC], errors="coerce").notna()]
    if not len(rows):
        return []
    rows = rows.reset_index(drop=True)
    seconds = rows[col.ROOFLINE_S] if col.ROOFLINE_S in rows.columns else pd.Series([None] * len(rows))
    cells = [
        f"{float(frac):.1%}" + ("" if missing(s) else f"\nof {float(s):.3g} s")
        for frac, s in zip(rows[col.ROOFLINE_FRAC], seconds)
    ]
    pivot = grid(rows, cells, "share of the roofline (roofline_s / time)")
    return [grid_table(pivot, f"{part.anchor}-roofline", f"{pivot.what} by {pivot.x or 'case'}")]


def trust_line(part: Part) -> str | None:
    """``show``'s warning about the measured times under contention (marked * in the tables), if any."""
    if part.method != Method.MEASURED:
        return None
    runs = list(dict.fromkeys(run for item in part.items for run in item.runs))
    return trust.warning(part.rows[col.TRUST], runs)


def _listed(values: Iterable[object]) -> str:
    """Distinct non-empty values with how many rows have each, the commonest first, :data:`LISTED` at most."""
    counts = Counter(str(v) for v in values if not missing(v) and str(v) != "")
    if not counts:
        return ""
    shown_values = [
        abridged(v, VALUE_CHARACTERS) + (f" ({n} rows)" if len(counts) > 1 else "")
        for v, n in counts.most_common(LISTED)
    ]
    more = len(counts) - LISTED
    return "; ".join(shown_values) + (f"; and {more} more" if more > 0 else "")


# Provenance lines: (what the page calls it, the column).
_MACHINE = (
    ("CPU instruction set", col.CPU_CAPABILITY),
    ("CPU flags", col.CPU_FLAGS),
    ("torch", col.TORCH_VERSION),
    ("CUDA", col.CUDA_VERSION),
    ("cuDNN", col.CUDNN_VERSION),
    ("driver", col.DRIVER_VERSION),
    ("threads", col.THREADS),
    ("timer", col.TIMER),
)


def provenance(part: Part, meta: dict) -> list[tuple[str, str]]:
    """Where the rows come from: commit, when, the machine (the GPU part a prediction modelled), the code each
    implementation ran, the suite file and its ``--set`` values (``meta``: the suite's meta.json, or {})."""
    rows = part.rows
    machine = "GPU part (predicted)" if part.method == Method.PREDICTED and part.device == "cuda" else "machine"
    lines = [
        ("results", shown(part.source)),
        ("git_sha", _listed(rows[col.GIT_SHA])),
        (machine, _listed(rows[col.DEVICE_NAME])),
    ]
    stamps = sorted(str(t) for t in rows[col.TIMESTAMP].dropna() if str(t))
    if stamps:
        lines.append(
            (
                "written",
                abridged(stamps[0], 40) + ("" if stamps[0] == stamps[-1] else f" to {abridged(stamps[-1], 40)}"),
            )
        )
    lines += [(name, _listed(rows[c])) for name, c in _MACHINE if c in rows.columns]
    if col.CODE_PATH in rows.columns:
        paths = [
            f"{legend}: {p}" for legend, p in zip(col.legends(rows), rows[col.CODE_PATH]) if isinstance(p, str) and p
        ]
        lines.append(("code_path", _listed(paths)))
    if meta.get("suite_file"):
        lines.append(("suite_file", abridged(meta["suite_file"], VALUE_CHARACTERS)))
    overrides = meta.get("overrides")
    if isinstance(overrides, dict) and overrides:
        sets = " ".join(
            f"--set {key}={','.join(map(str, values)) if isinstance(values, list) else values}"
            for key, values in overrides.items()
        )
        lines.append(("--set", abridged(sets, VALUE_CHARACTERS)))
    return [(k, v) for k, v in lines if v]
