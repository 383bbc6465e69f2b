"""The peak told by source line: the grouped table and the one-line story.

Rows (:mod:`.rows`) are grouped by their source line, largest first, each with its share of the peak
above the baseline, how many storages it holds and what they are for. The story names the largest
family of storages of one shape and dtype, each by the variable its line assigns, e.g.
``vanilla at seq_len=16384: 3 × [1, 12, 16384, 16384] float32 = 36 GiB: weights saved for backward
(vanilla.py:50), ...``.
"""

from __future__ import annotations

import collections
import linecache
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table

from topk_bench.capture.rows import Category, Row
from topk_bench.capture.sources import PROJECT_ROOT, code_line
from topk_bench.units import format_bytes
from topk_bench.untrusted import text

_ASSIGNED = re.compile(r"\s*([A-Za-z_][\w.]*(?:\[[^\]]*\])?(?:\s*,\s*[A-Za-z_][\w.]*)*)\s*(?::[^=]+)?[+\-*/@]?=(?!=)")


@dataclass(frozen=True)
class Group:
    source: str
    code: str
    bytes: int
    storages: int
    categories: tuple[str, ...]  # largest first


def groups(rows: Iterable[Row]) -> list[Group]:
    """The rows by source line, largest first."""
    by_source: dict[str, list[Row]] = collections.defaultdict(list)
    for row in rows:
        by_source[row.source].append(row)
    out = []
    for source, members in by_source.items():
        per_category: collections.Counter[str] = collections.Counter()
        for row in members:
            per_category[str(row.category)] += row.bytes
        out.append(
            Group(
                source,
                code_line(source),
                sum(r.bytes for r in members),
                len(members),
                tuple(c for c, _ in per_category.most_common()),
            )
        )
    return sorted(out, key=lambda g: (-g.bytes, g.source))


def _function(source: str) -> str:
    """The function a source line is in (the nearest ``def`` above it, less indented), or ''."""
    file, _, line = source.rpartition(":")
    if not line.isdigit():
        return ""
    number = int(line)
    indent = len(linecache.getline(_path(file), number)) - len(linecache.getline(_path(file), number).lstrip())
    for above in range(number - 1, 0, -1):
        candidate = linecache.getline(_path(file), above)
        stripped = candidate.lstrip()
        if stripped.startswith(("def ", "async def ")) and len(candidate) - len(stripped) < indent:
            return stripped.split("def ", 1)[1].split("(", 1)[0]
    return ""


def _path(file: str) -> str:
    path = Path(file) if Path(file).is_absolute() else PROJECT_ROOT / file
    return str(path if path.is_file() else Path.cwd() / file)


def variable(source: str, op: str = "") -> str:
    """What a source line makes: the variable it assigns, else its op in its function (``bmm in sampled_mm``)."""
    match = _ASSIGNED.match(code_line(source))
    if match:
        return match.group(1)
    name = op.split(".")[1] if op.count(".") >= 1 else (op or "?")
    function = _function(source)
    return f"{name} in {function}" if function else name


def _op_name(op: str) -> str:
    """``_softmax_backward_data`` of ``aten._softmax_backward_data.default``."""
    return op.split(".")[1] if op.count(".") >= 1 else op


def describe(row: Row) -> str:
    name, where = variable(row.source, row.op), row.source.rpartition("/")[2]
    assigned = bool(_ASSIGNED.match(code_line(row.source)))
    return {
        Category.SAVED: f"{name} saved for backward ({where})",
        Category.GRADIENTS: (f"the gradient through {name}" if assigned else f"a gradient: {name}") + f" ({where})",
        Category.TEMPORARIES: (
            f"{name}, a temporary"
            if row.shape
            else f"a buffer of {_op_name(row.op)}'s kernel"
            if row.op
            # a block known from the allocator's history alone: where, no op or shape
            else f"{name}, a block"
            if assigned
            else "a block"
        )
        + f" ({where})",
        Category.WORKSPACE: f"a workspace ({_op_name(row.op) + ', ' if row.op else ''}{where})",
        Category.INPUTS: f"{name}, built in the region ({where})",
    }[row.category]


def story(what: str, rows: list[Row], peak_bytes: int, baseline_bytes: int) -> str:
    """One line: the largest family of same-shaped storages at the peak, each named, and the rest."""
    above = peak_bytes - baseline_bytes
    if not rows:
        return f"{what}: nothing above the inputs and parameters ({format_bytes(baseline_bytes)}) at the peak"
    families: dict[tuple[int, str], list[Row]] = collections.defaultdict(list)
    for row in rows:  # storages of one size and dtype, whatever their views ([12, L, L] from bmm, [1, 12, L, L])
        families[(row.bytes, row.dtype)].append(row)
    _, family = max(families.items(), key=lambda item: (sum(r.bytes for r in item[1]), item[0]))
    shape, dtype = max((r.shape for r in family), key=lambda s: (s.count(","), s)), family[0].dtype
    total = sum(r.bytes for r in family)
    named = collections.Counter(describe(r) for r in family)
    parts = [text if n == 1 else f"{n} × {text}" for text, n in named.most_common()]
    if len(parts) > 4:
        parts = parts[:4] + [f"{sum(n for _, n in named.most_common()[4:])} more"]
    shape_text = f"{shape} {dtype}".strip() or "blocks"
    line = f"{what}: {len(family)} × {shape_text} = {format_bytes(total)}: {', '.join(parts)}"
    rest = above - total
    if rest > 0:
        line += f"; the other {len(rows) - len(family)} storages {format_bytes(rest)} ({100 * rest / above:.1f}%)"
    return line


def table(rows: list[Row], meta: Mapping[str, Any], limit: int = 12, width: int = 160) -> Table:
    """The grouped table: one line per source line, largest first, at most ``limit`` (then the rest in one),
    to fit ``width`` columns."""
    above = meta["peak_bytes"] - meta["baseline_bytes"]
    out = Table(box=box.SIMPLE_HEAD)
    everything = groups(rows)
    widest = min(max((len(g.source) for g in everything), default=6), 60)
    # The source line and the numbers keep their width; the code gives way first, then what the storages are.
    code = max(8, min(48, width - widest - (10 + 6 + 8) - 22 - 16))
    out.add_column("source", no_wrap=True, min_width=widest)
    out.add_column("code", no_wrap=True, overflow="ellipsis", max_width=code)
    for name, least in (("bytes", 10), ("share", 6), ("storages", 8)):
        out.add_column(name, justify="right", no_wrap=True, min_width=least)
    out.add_column("what", min_width=18, overflow="fold")
    for group in everything[:limit]:
        out.add_row(
            text(group.source),  # a path and a line of code (`scores[mask]`): text, never markup
            text(group.code),
            format_bytes(group.bytes),
            _share(group.bytes, above),
            str(group.storages),
            ", ".join(group.categories),
        )
    rest = everything[limit:]
    if rest:
        rest_bytes = sum(g.bytes for g in rest)
        out.add_row(
            f"({len(rest)} more line{'' if len(rest) == 1 else 's'})",
            "",
            format_bytes(rest_bytes),
            _share(rest_bytes, above),
            str(sum(g.storages for g in rest)),
            "",
        )
    out.add_row(
        "total",
        "",
        format_bytes(sum(r.bytes for r in rows)),
        _share(sum(r.bytes for r in rows), above),
        str(len(rows)),
        "",
        style="bold",
    )
    return out


def stages_line(stages: Mapping[str, Mapping[str, Any]]) -> str:
    """``stages: forward.indexer 1.27 s, peak 101 MiB; ...``: each marked stage's cost (profile.json's ``stages``)."""
    parts = []
    for key, cost in stages.items():
        said = [f"{cost['time_s']:.3g} s" if cost.get("time_s") is not None else ""]
        if cost.get("peak_bytes") is not None:
            said.append(f"peak {format_bytes(cost['peak_bytes'])}")
        parts.append(f"{key} {', '.join(x for x in said if x)}")
    return "stages: " + "; ".join(parts)


def headline(meta: Mapping[str, Any]) -> str:
    """``vanilla at seq_len=64: peak 357 KiB = inputs and parameters 81 KiB + 276 KiB above them (backward)``."""
    above = meta["peak_bytes"] - meta["baseline_bytes"]
    return (
        f"{meta['what']}, {meta['method']} on {meta['device']}: peak {format_bytes(meta['peak_bytes'])} = "
        f"inputs and parameters {format_bytes(meta['baseline_bytes'])} + {format_bytes(above)} above them, "
        f"reached in the {meta['peak_in']}"
    )


def markdown(rows: list[Row], meta: Mapping[str, Any], limit: int = 8) -> str:
    """The grouped table as Markdown (REPRODUCTION.md's "Where the memory goes")."""
    above = meta["peak_bytes"] - meta["baseline_bytes"]
    lines = ["| source | code | bytes | share | storages | what |", "|---|---|--:|--:|--:|---|"]
    everything = groups(rows)
    for group in everything[:limit]:
        code = group.code if len(group.code) <= 60 else group.code[:57] + "..."
        lines.append(
            f"| `{group.source}` | `{code}` | {format_bytes(group.bytes)} | {_share(group.bytes, above)} "
            f"| {group.storages} | {', '.join(group.categories)} |"
        )
    rest = everything[limit:]
    if rest:
        rest_bytes = sum(g.bytes for g in rest)
        lines.append(
            f"| {len(rest)} more lines | | {format_bytes(rest_bytes)} | {_share(rest_bytes, above)} "
            f"| {sum(g.storages for g in rest)} | |"
        )
    return "\n".join(lines)


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"
