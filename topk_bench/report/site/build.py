"""``topk-bench report``: everything is read and checked first (bad input writes nothing), then the site is
written into a new hidden folder beside ``--out`` and put in its place in one rename, so that a report that fails
half-way leaves no partial folder and an earlier report stays whole until the new one replaces it.

``--out`` may be a new path, an empty folder or a folder an earlier report wrote (it holds :data:`MARKER`): any
other folder is not replaced (it may be someone's work), nor is a file.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from topk_bench import fileio
from topk_bench.errors import BadInput, file_error
from topk_bench.report import crossovers as cross
from topk_bench.report.plots.figure import render
from topk_bench.report.plots.inputs import FigureInput, figure_inputs
from topk_bench.report.site import parts as site_parts
from topk_bench.report.site.history import History, check_template, commit_link, read_history
from topk_bench.report.site.parts import Figure, Part
from topk_bench.report.steps import STEP_FACTOR
from topk_bench.untrusted import file_name, shown

MARKER = ".topk-bench-report"
TEMPLATES = Path(__file__).with_name("templates")
# History figures drawn at most (the cases with a step or a verdict first); the table lists every case.
MAX_HISTORY_FIGURES = 60
# Commits the history table shows (the newest); the figures show them all.
MAX_HISTORY_COLUMNS = 30


@dataclass(frozen=True)
class Options:
    baseline: str | None = None  # the crossovers' baseline (implementation or label); None: sdpa, else vanilla
    length: str | None = None  # the crossovers' length column; None: seq_len, else kv_len
    commit_url: str | None = None  # a history point's link: https://.../commit/{sha}
    step_factor: float = STEP_FACTOR
    relative_to: str | None = None  # the history's times over this implementation's in the same run


@dataclass
class Suite:
    name: str
    anchor: str
    title: str
    parts: list[Part] = field(default_factory=list)


@dataclass
class Page:
    sources: list[str]
    suites: list[Suite]
    history: History | None
    options: Options
    warnings: list[str] = field(default_factory=list)

    @property
    def parts(self) -> list[Part]:
        return [part for suite in self.suites for part in suite.parts]


def check_out(out: Path) -> None:
    """Bad input unless ``out`` may be written: a new path, an empty folder or an earlier report's folder."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise BadInput("expected a folder for the report, got a file", file=out, key="--out")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise BadInput(
            "a folder that `topk-bench report` did not write: not replaced (name a new or empty folder)",
            file=out,
            key="--out",
        )


def _meta(item: FigureInput, results: Path) -> dict:
    """The suite's meta.json of an item (its suite_file and --set values), {} where there is none to read."""
    folder = results / item.folder if results.is_dir() else results.parent
    try:
        meta = fileio.read_json(folder / f"{item.spec.suite}.meta.json")
    except (OSError, BadInput):
        return {}
    return meta if isinstance(meta, dict) else {}


def read_page(results: list[Path], history: Path | None, options: Options, warn: Callable[[str], None]) -> Page:
    """Every file read and checked, nothing written."""
    check_template(options.commit_url)
    warnings: list[str] = []

    def heard(line: str) -> None:
        warnings.append(line)
        warn(line)

    suites: dict[str, Suite] = {}
    for path in results:
        items = figure_inputs(path, heard)
        grouped: dict[tuple, list[FigureInput]] = {}
        for item in items:
            grouped.setdefault((item.folder, item.spec.suite, item.device, item.method), []).append(item)
        for (folder, suite, device, method), members in grouped.items():
            section = suites.setdefault(
                suite, Suite(suite, f"suite-{len(suites)}", shown(members[0].spec.title or suite))
            )
            anchor = f"{section.anchor}-{len(section.parts)}-{file_name(device, method)}"
            rows = pd.concat([m.rows for m in members], ignore_index=True)
            source = path / folder if folder != Path() else path
            part = Part(anchor, suite, device, method, str(source), rows, members)
            part.trust = site_parts.trust_line(part)
            part.provenance = site_parts.provenance(part, _meta(members[0], path))
            part.crossovers = cross.crossovers(rows, options.baseline, options.length)
            if cross.baseline_rows(rows, options.baseline)[0] is None:
                part.notes.append(f"no crossover: no rows of {options.baseline or 'sdpa or vanilla'} (--baseline)")
            elif cross.length_of(rows, options.length) is None:
                part.notes.append(f"no crossover: no swept length ({options.length or 'seq_len, kv_len'}; --length)")
            section.parts.append(part)
    page_history = read_history(history, options.step_factor, options.relative_to) if history is not None else None
    if page_history is not None:
        for line in page_history.notes:
            heard(line)
    return Page([str(p) for p in results], list(suites.values()), page_history, options, warnings)


def _write(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fileio.write_atomic(path, data.encode() if isinstance(data, str) else data)


def _draw_part(part: Part, staging: Path) -> None:
    """The part's tables (their whole CSVs beside the page) and figures, written under ``staging``."""
    for tables, target in (
        (site_parts.part_tables(part), part.tables),
        (site_parts.roofline_tables(part), part.roofline),
    ):
        for table, whole in tables:
            target.append(table)
            if whole is not None and table.csv is not None:
                _write(staging / table.csv, whole)
    for item in part.items:
        if len(item.rows) > site_parts.MAX_DRAWN_ROWS:
            part.notes.append(
                f"{item.stem}: {len(item.rows)} rows, more than the {site_parts.MAX_DRAWN_ROWS} a figure of this page "
                "draws: `topk-bench plot` draws it"
            )
            continue
        failures: list[str] = []
        placed = dataclasses.replace(item, folder=Path(part.anchor))
        for path in render(placed, staging / "figures", ("svg",), failures):
            part.figures.append(Figure(path.relative_to(staging).as_posix(), path.stem))
        part.notes += failures


@dataclass
class HistoryView:
    """The history as the template shows it: the newest commits' columns, and the figures drawn."""

    history: History
    columns: list[int]
    links: list[str | None]
    figures: dict[str, tuple[str, int, int, list]] = field(default_factory=dict)


def _draw_history(history: History, commit_url: str | None, staging: Path) -> HistoryView:
    from topk_bench.report.site import history_figure

    columns = list(range(len(history.commits)))[-MAX_HISTORY_COLUMNS:]
    links = [commit_link(commit_url, c.sha) for c in history.commits]
    view = HistoryView(history, columns, links)
    notable = sorted(
        history.series,
        key=lambda s: not (s.time_steps or s.peak_steps or any(v and v.verdict != "unchanged" for v in s.verdicts)),
    )
    for series in notable[:MAX_HISTORY_FIGURES]:
        drawn = history_figure.draw(series, history.commits, history.relative_to)
        src = f"history/{series.anchor}.svg"
        _write(staging / src, drawn.svg)
        view.figures[series.case_id] = (src, drawn.width, drawn.height, drawn.areas)
    return view


def history_cell(series, i: int, relative_to: str | None = None) -> tuple[str, str, str]:
    """(text, classes, tooltip) of a case's cell of the history table at commit ``i``."""
    from topk_bench.units import short_seconds

    value, relative = series.times[i], relative_to is not None
    classes = [("step-up" if s.up else "step-down") for s in series.time_steps if s.index == i]
    verdict = series.verdicts[i]
    tip = ""
    if verdict is not None:
        if verdict.verdict in ("regressed", "improved"):
            classes.append(verdict.verdict)
        tip = f"gate: {verdict.verdict}" + (f", ×{verdict.estimate:.3g}" if verdict.estimate is not None else "")
        if verdict.low is not None and verdict.high is not None:
            tip += f" ({verdict.low:.3g} to {verdict.high:.3g})"
    text = "-" if value is None else (f"×{value:.3f}" if relative else short_seconds(value))
    return text, " ".join(classes), tip


def _environment():
    import jinja2
    import markupsafe

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,  # every value written into the page is escaped
        undefined=jinja2.StrictUndefined,
        # Text shown as text (control and direction characters written as escapes); the template's own macros
        # (Markup: escaped already) as they are.
        finalize=lambda value: (
            shown(value) if isinstance(value, str) and not isinstance(value, markupsafe.Markup) else value
        ),
        trim_blocks=True,
        lstrip_blocks=True,
    )


def write_page(page: Page, staging: Path) -> None:
    """The site into ``staging`` (a new folder)."""
    for part in page.parts:
        _draw_part(part, staging)
    found = [f for part in page.parts for f in part.crossovers]
    _write(staging / "crossovers.csv", cross.table(found).to_csv(index=False))
    view = _draw_history(page.history, page.options.commit_url, staging) if page.history is not None else None
    html = (
        _environment()
        .get_template("index.html.j2")
        .render(
            page=page,
            view=view,
            sentence=cross.sentence,
            generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            hcell=history_cell,
            phrase=cross.phrase,
            crossover_rows=site_parts.crossover_rows,
            max_rows=site_parts.MAX_ROWS,
        )
    )
    _write(staging / "index.html", html)
    shutil.copyfile(TEMPLATES / "style.css", staging / "style.css")
    _write(staging / MARKER, "written by topk-bench report: a later report replaces this folder\n")


def _place(staging: Path, out: Path) -> None:
    """``staging`` renamed to ``out``; an earlier report there is replaced (checked by :func:`check_out`)."""
    old = None
    if out.is_dir():
        old = out.with_name(f".{out.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
        out.rename(old)
    try:
        staging.rename(out)
    except OSError:
        if old is not None:
            old.rename(out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def build(
    results: list[Path],
    out: Path,
    history: Path | None = None,
    options: Options = Options(),
    warn: Callable[[str], None] = lambda line: None,
) -> Path:
    """The report of ``results`` (and ``history``) in ``out``; returns its index.html."""
    if not results and history is None:
        raise BadInput("nothing to report: give RESULTS, --history, or both")
    check_out(out)
    page = read_page(results, history, options, warn)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = out.with_name(f".{out.name}.new-{os.getpid()}-{secrets.token_hex(4)}")
        staging.mkdir()
    except OSError as exc:
        raise file_error(exc, "cannot create the report's folder", file=out) from None
    try:
        write_page(page, staging)
        check_out(out)  # nothing made it another's folder meanwhile
        _place(staging, out)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise file_error(exc, "cannot write the report", file=out) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out / "index.html"
