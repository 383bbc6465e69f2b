"""Renderers of a ``Comparison``: a rich table for the terminal, Markdown for a pull-request comment,
and github-action-benchmark's ``customSmallerIsBetter`` JSON for existing dashboards."""

from __future__ import annotations

import collections
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console

from topk_bench import fileio
from topk_bench.report import relative
from topk_bench.report.compare import SEVERITY, CaseComparison, Comparison, case_name, parse_times, records
from topk_bench.report.stats import MetricResult, Verdict
from topk_bench.report.texttable import TextTable
from topk_bench.results import columns as col
from topk_bench.results.columns import parameter_columns
from topk_bench.status import Status
from topk_bench.units import format_bytes, format_seconds
from topk_bench.untrusted import markdown as markdown_text
from topk_bench.untrusted import markup, shown

STYLE = {
    Verdict.REGRESSION: "bold red",
    Verdict.INVALID: "bold red",
    Verdict.IMPROVEMENT: "green",
    Verdict.INCONCLUSIVE: "yellow",
    Verdict.UNCHANGED: "dim",
}
COLUMNS = ("case", "device", "status", "peak memory", "time (median)", "p", "verdict")


def columns(c: Comparison) -> tuple[str, ...]:
    """The table's header: the time column says what the times were divided by."""
    if not c.relative_to:
        return COLUMNS
    return tuple(f"time / {c.relative_to} (median)" if name == "time (median)" else name for name in COLUMNS)


def summary(c: Comparison) -> str:
    counts = {v: len(c.with_verdict(v)) for v in SEVERITY}
    parts = [f"{counts[v]} {v.value}" for v in SEVERITY]
    return (
        f"{len(c.cases)} case(s) compared: " + ", ".join(parts) + f"; {len(c.only_new)} new, {len(c.only_base)} missing"
    )


def outcome(c: Comparison) -> str:
    """The gate's word: REGRESSION, FAILED (nothing or not everything could be judged), no regression, or
    first run (no BASE yet)."""
    if c.first_run:
        return "FAILED" if not c.passed else "first run, nothing to compare"
    return "REGRESSION" if c.has_regression else "FAILED" if not c.passed else "no regression"


def rows(c: Comparison) -> list[tuple[CaseComparison, tuple[str, ...]]]:
    """One row of text per case, worst first (stable within a verdict: suite order)."""
    ordered = sorted(c.cases, key=lambda case: SEVERITY.index(case.verdict))
    return [(case, _cells(case, c.relative_to)) for case in ordered]


def notes(c: Comparison) -> list[str]:
    """Why a case is inconclusive or a ratio beyond the factor did not count: one line per reason, naming the
    case when one case has it, counting them when several do (a one-sample suite: every case, one line)."""
    by_reason: dict[tuple[str, str], list[CaseComparison]] = {}
    for case in c.cases:
        for m in case.metrics:
            if m.note:
                by_reason.setdefault((m.metric, m.note), []).append(case)
    out = []
    for (name, note), cases in by_reason.items():
        if len(cases) == 1:
            out.append(f"{cases[0].name} [{cases[0].case_id}]: {name}: {note}")
        else:
            out.append(f"{len(cases)} cases ({cases[0].name}, ...): {name}: {note}")
    return out


def print_rich(c: Comparison, console: Console | None = None) -> None:
    """The cases, one line each in its verdict's colour (:class:`topk_bench.report.texttable.TextTable`: linear in the
    cases), then the notes, warnings, new and missing cases and failures; what the files say is shown as text
    (:mod:`topk_bench.untrusted`)."""
    console = console or Console(width=160)
    for line in c.pairing:  # names columns and values from the files: text
        console.print(shown(line), highlight=False, markup=False, emoji=False, soft_wrap=True)
    ordered = rows(c)
    headers = columns(c)
    table = TextTable(
        shown(f"compare {c.base} → {c.new}"),
        headers,
        [False] * len(headers),
        [[shown(cell) for cell in cells] for _, cells in ordered],
        [STYLE[case.verdict] for case, _ in ordered],
    )
    table.print(console)
    for line in notes(c):
        console.print(f"[yellow]note[/]: {markup(line)}", highlight=False, emoji=False)
    for line in c.warnings:
        console.print(f"[bold yellow]warning[/]: {markup(line)}", highlight=False, emoji=False)
    for title, listed in (("new", c.only_new), ("missing", c.only_base)):
        for case_id, name in listed:
            console.print(shown(f"{title}: {name} [{case_id}]"), highlight=False, markup=False, emoji=False)
    for line in c.failures:
        console.print(f"[bold red]fail[/]: {markup(line)}", highlight=False, emoji=False, soft_wrap=True)
    style = "green" if c.passed else "bold red"
    console.print(f"[{style}]{outcome(c)}[/]: {summary(c)}", highlight=False)


def markdown(c: Comparison) -> str:
    """A pull-request comment: summary, the cases that moved, then every case folded away."""
    t = c.thresholds
    head = {
        "REGRESSION": "❌ **Regression**",
        "FAILED": "❌ **Failed**",
        "first run, nothing to compare": "ℹ️ **First run, nothing to compare**",
    }.get(outcome(c), "✅ **No regression**")
    lines = [
        "## topk-bench compare",
        "",
        f"{head}: {summary(c)}.",
        "",
        f"Rules: peak memory > ×{t.memory_factor:g}, reserved (CUDA) > ×{t.reserved_factor:g}, "
        + (f"time over {c.relative_to}'s at the same parameters (per round) " if c.relative_to else "time ")
        + f"median > ×{t.time_factor:g} with Mann-Whitney p < {t.alpha:g}; status `ok` → other.",
        "",
    ]
    lines += [f"{_md_escape(p)}" for p in c.pairing] + ([""] if c.pairing else [])
    lines += [f"> ⚠️ {_md_escape(w)}" for w in c.warnings] + ([""] if c.warnings else [])
    lines += [f"- ❌ {_md_escape(f)}" for f in c.failures] + ([""] if c.failures else [])
    ordered = rows(c)
    moved = [(case, cells) for case, cells in ordered if case.verdict is not Verdict.UNCHANGED]
    if moved:
        lines += _md_table(columns(c), (cells for _, cells in moved)) + [""]
    if notes(c):
        lines += ["Notes:", *(f"- {_md_escape(n)}" for n in notes(c)), ""]
    for title, listed in (("New cases", c.only_new), ("Missing cases", c.only_base)):
        if listed:
            lines += [f"{title}:", *(f"- {_md_escape(name)} {_md_code(cid)}" for cid, name in listed), ""]
    lines += [
        "<details><summary>All cases</summary>",
        "",
        *_md_table(columns(c), (cells for _, cells in ordered)),
        "",
        "</details>",
        "",
    ]
    return "\n".join(lines)


# The value of a case that did not end ``ok`` (its entries' ``extra`` names the status): larger than any
# byte count or time a case can have, so that a series going from a measurement to a failure is far above
# any alert threshold, one staying failed is unchanged, and every value stays a finite number (JSON has no NaN).
FAILED_VALUE = 1e15
# The entries of a case, its suffix in their names: (metric, column, unit); compare's gate judges each of them.
EXPORTED = (
    (col.PEAK_BYTES, col.PEAK_BYTES, "bytes"),
    (col.RESERVED_BYTES, col.RESERVED_BYTES, "bytes"),
    ("time_s", col.TIME_MEDIAN_S, "s"),
)


def benchmark_json(new: pd.DataFrame, c: Comparison) -> list[dict]:
    """github-action-benchmark ``customSmallerIsBetter``: ``[{name, unit, value, range?, extra?}]``, unique names.

    Every case of NEW gives an entry per metric its (device, method) has (``peak_bytes``; ``reserved_bytes``
    where the rows have it, CUDA; ``time_s`` where timed), named ``<suite>/<case> [<device>, <method>]
    <metric>``. An ``ok`` case gives its values, ``extra`` its ratio to BASE; any other status gives
    :data:`FAILED_VALUE`, ``extra`` starting ``status=<status>``, so that a failure is a point of its series
    (an alert when it follows a measurement), never a gap.
    """
    params = parameter_columns(new.columns)
    judged = {case.case_id: case for case in c.cases}
    rows = records(new, params)
    names = {
        cid: f"{row.get('suite', '')}/{case_name(row, params)} [{row['device']}, {row['method']}]"
        for cid, row in rows.items()
    }
    # Names are a dashboard's series keys: make them unique, and stable for a given suite.
    clashes = collections.Counter(names.values())
    ok = new[new[col.STATUS] == Status.OK]
    has = {
        key: {metric for metric, column, _ in EXPORTED if column in group and group[column].notna().any()}
        for key, group in ok.groupby([col.DEVICE, col.METHOD], sort=False)
    }
    divided = relative.relative_times(new, c.relative_to, c.new) if c.relative_to else {}
    entries = []
    for row in rows.values():
        name = names[row[col.CASE_ID]]
        name += f" {row['case_id']}" if clashes[name] > 1 else ""
        exported = has.get((row[col.DEVICE], row[col.METHOD])) or {col.PEAK_BYTES}
        case = judged.get(row[col.CASE_ID])
        for metric, column, unit in EXPORTED:
            if metric not in exported:
                continue
            entry: dict[str, Any] = {"name": f"{name} {metric}", "unit": unit}
            if row[col.STATUS] != Status.OK:
                error = " ".join(str(row.get(col.ERROR) or "").split())[:200]
                entry.update(
                    value=FAILED_VALUE,
                    extra=f"status={row['status']}; case_id={row['case_id']}" + (f"; {error}" if error else ""),
                )
                entries.append(entry)
                continue
            value = row[column]
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            entry["value"] = float(value)
            if metric == "time_s":
                times = parse_times(row[col.TIMES_S], file=c.new, case_id=row[col.CASE_ID])
                if len(times) > 1:
                    entry["range"] = f"± {(max(times) - min(times)) / 2:.3g}"
            result = case.metric(metric) if case else None
            ratio = "" if result is None or result.ratio is None else f", ×{result.ratio:.3f} vs base"
            entry["extra"] = f"status=ok; case_id={row['case_id']}; " + (
                f"{result.verdict.value}{ratio}" if result else "not judged" if case else "not in base"
            )
            entries.append(entry)
        if c.relative_to:
            entries += _relative_entries(name, row, case, divided.get(row[col.CASE_ID]), c.relative_to)
    return entries


def _relative_entries(
    name: str, row: Mapping, case: CaseComparison | None, divided: relative.Relative | str | None, impl: str
) -> list[dict]:
    """``--relative-to``: the case's time over the reference's (``ratio``), where NEW has both; a failed case a
    failure's value, as its other entries."""
    metric = relative.metric_name(impl)
    entry: dict[str, Any] = {"name": f"{name} {metric}", "unit": "ratio"}
    if row[col.STATUS] != Status.OK:
        return [{**entry, "value": FAILED_VALUE, "extra": f"status={row['status']}; case_id={row['case_id']}"}]
    if not isinstance(divided, relative.Relative):
        return []
    samples = divided.samples
    entry["value"] = float(pd.Series(samples).median())
    if len(samples) > 1:
        entry["range"] = f"± {(max(samples) - min(samples)) / 2:.3g}"
    result = case.metric(metric) if case else None
    ratio = "" if result is None or result.ratio is None else f", ×{result.ratio:.3f} vs base"
    per = "per round" if divided.by_round else "per sample"
    entry["extra"] = f"status=ok; case_id={row['case_id']}; over {divided.reference} {per}; " + (
        f"{result.verdict.value}{ratio}" if result else "not judged" if case else "not in base"
    )
    return [entry]


def write_json(path: str | Path, new: pd.DataFrame, c: Comparison) -> None:
    """The entries as a JSON list, one entry a line (json's C encoder: ``indent`` takes its pure-Python one, seconds
    for 100,000 cases)."""
    entries = [json.dumps(entry, ensure_ascii=False) for entry in benchmark_json(new, c)]
    text = "[\n" + ",\n".join(f"  {entry}" for entry in entries) + "\n]\n" if entries else "[]\n"
    fileio.write_atomic(Path(path), text.encode())


def write_markdown(path: str | Path, c: Comparison) -> None:
    fileio.write_atomic(Path(path), markdown(c).encode())


def _cells(case: CaseComparison, relative_to: str = "") -> tuple[str, ...]:
    status = case.new_status if case.base_status == case.new_status else f"{case.base_status} → {case.new_status}"
    memory = case.metric(col.PEAK_BYTES)
    reserved = case.metric(col.RESERVED_BYTES)
    time = case.metric(relative.metric_name(relative_to)) if relative_to else case.metric("time_s")
    time_format = _times_over if relative_to else format_seconds
    memory_text = _change(memory, format_bytes)
    if reserved:
        memory_text += f" (reserved {_change(reserved, format_bytes)})"
    p = "" if time is None or time.p_value is None else f"{time.p_value:.2g}"
    return (
        f"{case.name} [{case.case_id}]",
        f"{case.device}/{case.method}",
        status,
        memory_text,
        _change(time, time_format),
        p,
        case.verdict.value,
    )


def _times_over(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}×"  # None: a side without its reference


def _change(m: MetricResult | None, fmt) -> str:
    if m is None:
        return "-"
    if m.ratio is None:
        return f"{fmt(m.base)} → {fmt(m.new)} ({m.verdict.value})"
    if m.base == m.new:
        return fmt(m.new)
    return f"{fmt(m.base)} → {fmt(m.new)} (×{m.ratio:.3f})"


def _md_escape(text: str) -> str:
    return markdown_text(text)


def _md_code(text: str) -> str:
    """A case_id as code (as it is); one holding a backtick, which would end the code span, escaped instead."""
    return _md_escape(text) if "`" in text else f"`{shown(text)}`"


def _md_table(header: tuple[str, ...], cell_rows) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md_escape(cell) for cell in cells) + " |" for cells in cell_rows]
    return lines
