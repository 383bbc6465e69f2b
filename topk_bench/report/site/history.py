"""A history folder: one results folder per commit, as a CI job keeps them (docs/regression.md, "A history of
results"), read as each case's series over the commits.

Layout::

    HISTORY/<n>-<short sha>/<suite>.csv         a run's results CSV (any number of suites)
    HISTORY/<n>-<short sha>/<suite>.meta.json   its meta.json
    HISTORY/<n>-<short sha>/verdict.json        optional: the time gate's verdict on this commit

or, as a commit's folder, the time gate's ``--out`` itself (``NEW/<n>/``: this commit's blocks of rows, each
case's value the median over them; ``BASE/`` is the base's; ``verdict.json``).

The commits are ordered by ``<n>`` where every folder's name starts with a number and ``-``, else by the earliest
``timestamp`` of each folder's rows (then its name). A commit's sha is the one its rows' ``git_sha`` says most
(``-dirty`` set aside), else the folder name's part after ``<n>-``; only hexadecimal shas make links. A folder
with no results CSV, hidden folders and files beside the folders are passed over (a CI job that failed before it
wrote a row); a ``verdict.json`` that cannot be read is left out, said on the page. A case is its ``case_id``:
its time (median, or the prediction's; or its time over another implementation's in the same run) and peak
where ``ok``, at each commit (:mod:`topk_bench.report.steps` marks the steps).
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from topk_bench import fileio
from topk_bench.errors import BadInput
from topk_bench.report import crossovers
from topk_bench.report.steps import STEP_FACTOR, Step, steps
from topk_bench.results import columns as col
from topk_bench.results.columns import parameter_columns
from topk_bench.results.frame import csv_files, left_out, load_results
from topk_bench.units import missing
from topk_bench.untrusted import abridged

VERDICT_FILE = "verdict.json"
VERDICTS = ("unchanged", "regressed", "improved", "undecided")
_NUMBERED = re.compile(r"^(\d+)-(.*)$")
_SHA = re.compile(r"^[0-9a-f]{7,40}$")


@dataclass(frozen=True)
class Verdict:
    """The time gate's word on one case at one commit (verdict.json's ``cases``)."""

    verdict: str
    estimate: float | None
    low: float | None
    high: float | None


@dataclass
class Commit:
    folder: Path
    sha: str  # hexadecimal, or "" when neither the rows nor the folder's name say one
    label: str  # what the page calls it: the short sha, else the folder's name
    rows: pd.DataFrame  # every case's last row (its name, suite and sha)
    verdicts: dict[str, Verdict] = field(default_factory=dict)  # by case_id, then by name
    gate: str = ""  # "passed against <base>" / "failed against <base>"
    blocks: list[pd.DataFrame] = field(default_factory=list)  # each run of the commit (the gate's NEW blocks)


@dataclass
class Series:
    """One case over the commits (None where it has no value there)."""

    suite: str
    case_id: str
    name: str
    times: list[float | None]
    peaks: list[float | None]
    verdicts: list[Verdict | None]
    time_steps: list[Step]
    peak_steps: list[Step]

    position: int = 0  # among the history's series: its anchor and its figure's file name (a case_id is any text)

    @property
    def anchor(self) -> str:
        return f"history-{self.position}"


@dataclass
class History:
    path: Path
    commits: list[Commit]
    series: list[Series]
    step_factor: float
    notes: list[str] = field(default_factory=list)
    relative_to: str | None = None  # the times are over this implementation's (None: seconds)


def _number(value: object) -> float | None:
    return (
        float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        else None
    )


def read_verdicts(path: Path) -> tuple[dict[str, Verdict], str, list[str]]:
    """(verdicts by case_id and by name, the gate's line, notes) of a ``verdict.json``; none where absent."""
    try:
        data = fileio.read_json(path)
    except FileNotFoundError:
        return {}, "", []
    except BadInput as exc:
        return {}, "", [f"{exc}: its verdicts are not shown"]
    cases = data.get("cases") if isinstance(data, dict) else None
    if not isinstance(cases, list):
        return {}, "", [f"{path}: cases: expected a list of cases: its verdicts are not shown"]
    out: dict[str, Verdict] = {}
    notes = []
    for number, case in enumerate(cases):
        verdict = case.get("verdict") if isinstance(case, dict) else None
        if verdict not in VERDICTS:
            notes.append(f"{path}: cases[{number}]: verdict: expected one of {', '.join(VERDICTS)}: left out")
            continue
        found = Verdict(verdict, *(_number(case.get(k)) for k in ("estimate", "low", "high")))
        for key in ("name", "case_id"):  # the case_id wins over a name that happens to be another's id
            if isinstance(case.get(key), str):
                out[case[key]] = found
    base = data.get("base")
    base = abridged(base, 12) if isinstance(base, str) else "?"
    gate = {True: f"passed against {base}", False: f"failed against {base}"}.get(data.get("passed"), "")
    return out, gate, notes


def _sha(rows: pd.DataFrame, name: str) -> str:
    said = Counter(str(s).removesuffix("-dirty") for s in rows[col.GIT_SHA] if isinstance(s, str) and s)
    for sha, _ in said.most_common():
        if _SHA.match(sha.lower()):
            return sha.lower()
    numbered = _NUMBERED.match(name)
    tail = (numbered.group(2) if numbered else name).lower()
    return tail if _SHA.match(tail) else ""


def _folders(path: Path) -> list[Path]:
    if not path.is_dir():
        raise BadInput(
            "expected a history folder (one results folder per commit), got a file"
            if path.exists()
            else "no such folder",
            file=path,
            key="--history",
        )
    return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))


def _has_results(folder: Path) -> bool:
    try:
        csv_files(folder)
    except BadInput:
        return False
    return True


def runs(folder: Path) -> list[Path]:
    """A commit folder's runs: itself where it holds results CSVs, else each block of this commit's rows that the
    time gate's ``--out`` keeps (``NEW/<n>/``, in the order of ``<n>``; ``BASE/`` is the base commit's)."""
    if _has_results(folder):
        return [folder]
    new = folder / "NEW"
    if not new.is_dir():
        return []
    blocks = [p for p in new.iterdir() if p.is_dir() and not p.name.startswith(".") and _has_results(p)]
    return sorted(blocks, key=lambda p: (0, int(p.name), "") if p.name.isdigit() else (1, 0, p.name))


def read_commits(path: Path) -> tuple[list[Commit], list[str]]:
    """The commits of a history folder, oldest first, and what the page should say of the folders left out."""
    commits, notes = [], []
    for folder in _folders(path):
        found = runs(folder)
        if not found:
            notes.append(f"{folder}: no results CSV (nor the time gate's NEW/<n>/): not a commit of the history")
            continue
        blocks = [load_results(run) for run in found]
        for run, block in zip(found, blocks):
            notes += [f"{run.relative_to(path)}: {line}" for line in left_out(block)]
        rows = pd.concat(blocks, ignore_index=True).drop_duplicates(col.CASE_ID, keep="last").reset_index(drop=True)
        verdicts, gate, said = read_verdicts(folder / VERDICT_FILE)
        notes += said
        sha = _sha(rows, folder.name)
        label = sha[:8] if sha else abridged(folder.name, 24)
        commits.append(Commit(folder, sha, label, rows, verdicts, gate, blocks))
    if not commits:
        raise BadInput(
            "no commit folder with a results CSV (expected HISTORY/<n>-<short sha>/<suite>.csv, or the time gate's "
            "--out there: docs/regression.md)",
            file=path,
            key="--history",
        )
    numbered = [_NUMBERED.match(c.folder.name) for c in commits]
    if all(numbered):
        commits.sort(key=lambda c: (int(_NUMBERED.match(c.folder.name).group(1)), c.folder.name))  # type: ignore[union-attr]
    else:
        commits.sort(key=lambda c: (min((str(t) for t in c.rows[col.TIMESTAMP] if str(t)), default="~"), c.folder.name))
    return commits, notes


def _names(frame: pd.DataFrame) -> dict[str, str]:
    """A name for each case_id: its suite, legend, workload and mode where its suite has several, and the
    parameters that tell it from another case of that legend (the last row of each case names it)."""
    names: dict[str, str] = {}
    for suite, rows in frame.groupby(col.SUITE, sort=False):
        legends = pd.Series(col.legends(rows), index=rows.index)
        params = [
            p for p in parameter_columns(rows.columns) if (rows[p].astype(str).groupby(legends).nunique() > 1).any()
        ]
        several = [c for c in (col.WORKLOAD, col.MODE) if rows[c].nunique() > 1]
        for case_id, legend, *values in zip(
            rows[col.CASE_ID], legends, *(rows[c] for c in several), *(rows[p] for p in params)
        ):
            given = [str(v) for v in values[: len(several)]]
            given += [
                f"{p}={crossovers.cell_text(v)}" for p, v in zip(params, values[len(several) :]) if not missing(v)
            ]
            names[str(case_id)] = " ".join([f"{suite} ·", legend, *given])
    return names


def _relative(rows: pd.DataFrame, impl: str, where: str) -> dict[str, float]:
    """Each case's time over ``impl``'s in the same run (:mod:`topk_bench.report.relative`: round by round where
    the rows have rounds), by case_id: the median of the ratios."""
    from topk_bench.report.relative import Relative, relative_times

    found = relative_times(rows, impl, where)
    ids = rows[col.CASE_ID].astype(str)
    return {ids[i]: statistics.median(r.samples) for i, r in found.items() if isinstance(r, Relative) and r.samples}


def _values(commit: Commit, relative_to: str | None) -> tuple[dict[str, float], dict[str, float]]:
    """(time, peak) of each case at a commit, by case_id: the median over its runs (the gate's blocks) of each
    run's value; ``relative_to``: the time over that implementation's."""
    times: dict[str, list[float]] = {}
    peaks: dict[str, list[float]] = {}
    for block in commit.blocks:
        records = block.to_dict("records")
        if relative_to is not None:
            for case_id, ratio in _relative(block, relative_to, str(commit.folder)).items():
                times.setdefault(case_id, []).append(ratio)
        for row in records:
            case_id = str(row[col.CASE_ID])
            for metric, into in (("time", times), ("memory", peaks)):
                if metric == "time" and relative_to is not None:
                    continue
                found = crossovers.value(row, metric)
                if found is not None:
                    into.setdefault(case_id, []).append(found)
    return (
        {k: statistics.median(v) for k, v in times.items()},
        {k: statistics.median(v) for k, v in peaks.items()},
    )


def read_history(path: Path, step_factor: float = STEP_FACTOR, relative_to: str | None = None) -> History:
    """Every case of the history's commits as a :class:`Series`, in the order the commits list them;
    ``relative_to``: each time over that implementation's at the same parameters in the same run (what a shared
    machine does to both divides out), its own cases without a time."""
    commits, notes = read_commits(path)
    everything = pd.concat([c.rows for c in commits], ignore_index=True)
    names = _names(everything)
    values = [_values(c, relative_to) for c in commits]
    suites = dict(zip(everything[col.CASE_ID].astype(str), everything[col.SUITE].astype(str)))
    series: list[Series] = []
    for case_id in dict.fromkeys(everything[col.CASE_ID].astype(str)):
        times = [times_at.get(case_id) for times_at, _ in values]
        peaks = [peaks_at.get(case_id) for _, peaks_at in values]
        name = names[case_id]
        verdicts = [c.verdicts.get(case_id) or c.verdicts.get(name) for c in commits]
        found = (steps(times, step_factor), steps(peaks, step_factor))
        series.append(Series(suites[case_id], case_id, name, times, peaks, verdicts, *found, len(series)))
    return History(path, commits, series, step_factor, notes, relative_to)


def commit_link(template: str | None, sha: str) -> str | None:
    """The commit's page by the user's ``--commit-url`` template (``{sha}`` replaced), for a hexadecimal sha only."""
    if not template or not _SHA.match(sha):
        return None
    return template.replace("{sha}", sha)


def check_template(template: str | None) -> None:
    """A ``--commit-url`` must be an http(s) address with ``{sha}`` in it: bad input otherwise."""
    if template is None:
        return
    if not re.match(r"^https?://[^\s\"'<>]+$", template) or "{sha}" not in template:
        raise BadInput(
            "expected an http(s) address with {sha} in it (https://github.com/ORG/REPO/commit/{sha}), got "
            f"{template!r}",
            key="--commit-url",
        )
