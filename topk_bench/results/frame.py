"""Results as a pandas DataFrame: one CSV, or every results CSV of a directory, read through :func:`store.read`.

``frame.attrs["dropped"]`` lists every line left out, so that each report can say
so: the lines :func:`store.read` rejects, and the earlier rows of a ``case_id``
that appears more than once (the last row wins, in file order).

pandas deep-copies ``attrs`` into every frame it derives (a slice, a group, a row of
``iterrows``): what they hold is :class:`Listed`, which such a copy shares, so that
reading a file stays linear in its rows.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pandas as pd

from topk_bench import fileio
from topk_bench.errors import BadInput
from topk_bench.results import columns as col
from topk_bench.results import store
from topk_bench.results.columns import CONTEXT_COLUMNS, REQUIRED_COLUMNS, TEXT_COLUMNS
from topk_bench.untrusted import argument

# How many left-out lines a report lists before it only counts the rest.
LISTED = 10


class Listed(list):
    """A list in ``frame.attrs`` that pandas' deep copies share instead of copying (one per derived frame: a
    slice of 100,000 rows would copy 100,000 strings). Readers only read it; a new list replaces it."""

    def __deepcopy__(self, memo: dict) -> Listed:
        return self

    def __copy__(self) -> Listed:
        return self


def csv_files(path: Path) -> list[Path]:
    """The results CSVs a path names: the file itself, or a directory's ``*.csv`` (hidden files excluded)."""
    if not path.exists():
        raise BadInput("no such file or directory", file=path)
    if path.is_dir():
        # Regular files only: opening a FIFO named *.csv would wait for a writer forever.
        files = sorted(p for p in path.glob("*.csv") if not p.name.startswith(".") and p.is_file())
        if not files:
            raise BadInput(
                "no results CSV (*.csv) in this directory (run `topk-bench run SUITE.toml --out DIR` first)", file=path
            )
        return files
    return [path]


# A case's profile directory holds this file (topk_bench.capture.files.META): its CSVs (peak.csv, ops.csv) are
# no results, and `run --profile` / `topk-bench profile` write them under a results directory.
PROFILE_FILE = "profile.json"


def results_folders(path: Path) -> list[Path]:
    """What ``show`` and ``plot`` read of a path: a file itself; a directory's own CSVs and each of its
    sub-folders' (any depth, hidden ones and profiles left out), folder by folder, the directory first
    (``results/`` after ``make demo`` is ``results/demo``). None anywhere: :func:`csv_files`'s error."""
    if not path.is_dir():
        return [path]
    folders = {
        p.parent
        for p in path.rglob("*.csv")
        if p.is_file()
        and not any(part.startswith(".") for part in p.relative_to(path).parts)
        and not (p.parent / PROFILE_FILE).is_file()
    }
    return sorted(folders, key=lambda f: (f != path, f)) or [path]


def _frame(table: store.Table, file: Path) -> tuple[pd.DataFrame, list[str]]:
    """The table's rows as a frame, and where each row is in the file (``x.csv line 3``)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(table.header)
    writer.writerows(row.values() for row in table.rows)  # each row's keys: the header, in its order
    buffer.seek(0)
    # Only an empty cell is missing: a label "NA" or "null" stays text.
    frame = pd.read_csv(buffer, dtype={c: str for c in TEXT_COLUMNS}, keep_default_na=False, na_values=[""])
    for column in CONTEXT_COLUMNS:  # a CSV without them: every reader sees them, empty
        if column not in frame.columns:
            frame[column] = pd.Series([None] * len(frame), dtype=object if column == col.TRUST else float)
    for column in (col.ERROR, col.LABEL, col.TIMES_S, col.DEVICE_NAME, col.GIT_SHA, col.TRUST):
        frame[column] = frame[column].fillna("")
    frame.attrs["dropped"] = Listed(table.dropped)
    frame.attrs["files"] = Listed([str(file)])
    return frame, [f"{file.name} line {n}" for n in table.line_numbers]


def _last_of_each_case(frame: pd.DataFrame, where: list[str]) -> pd.DataFrame:
    """One row per ``case_id``, the last; each earlier one is listed in ``attrs["dropped"]`` (``where``: the
    line of each row)."""
    last = {cid: i for i, cid in enumerate(frame[col.CASE_ID])}
    dropped = [
        f"{where[i]}: case_id {cid} again at {where[last[cid]]}, which is used"
        for i, cid in enumerate(frame[col.CASE_ID])
        if last[cid] != i
    ]
    if not dropped:
        return frame
    attrs = {**frame.attrs, "dropped": Listed([*frame.attrs["dropped"], *dropped])}
    frame = frame.iloc[sorted(last.values())].reset_index(drop=True)
    frame.attrs = attrs
    return frame


def load_results(path: str | Path) -> pd.DataFrame:
    """A results CSV, or every results CSV of a directory, as one DataFrame (required columns first; the
    context columns of a CSV written without them are there, empty).

    ``frame.attrs["dropped"]`` lists the lines left out (cut, an unknown status, a
    number that is not one, an earlier row of a repeated ``case_id``).
    """
    frames, where = [], []
    for file in csv_files(Path(path)):
        table = store.read(file)
        if not table.header:
            raise BadInput("empty file, expected a header with the results columns", file=file)
        frame, lines = _frame(table, file)
        frames.append(frame)
        where += lines
    if len(frames) == 1:
        frame = frames[0]
    else:
        frame = pd.concat(frames, ignore_index=True, sort=False)
        frame.attrs = {key: Listed(item for f in frames for item in f.attrs[key]) for key in ("dropped", "files")}
    attrs = frame.attrs
    frame = frame[[*REQUIRED_COLUMNS, *[c for c in frame.columns if c not in REQUIRED_COLUMNS]]]
    frame.attrs = attrs
    return _last_of_each_case(frame, where)


def runs_of(frame: pd.DataFrame, rows: pd.Series | None = None) -> list[str]:
    """The ``run`` arguments that wrote ``frame``'s rows (those where ``rows`` is true): for each results file of
    theirs, the suite file its meta.json names (``SUITE`` when it names none) and ``--out`` its folder."""
    chosen = frame if rows is None else frame[rows]
    suites = set(chosen[col.SUITE].astype(str)) if len(chosen) else set()
    runs = []
    for file in map(Path, frame.attrs.get("files", [])):
        if file.stem not in suites:
            continue
        try:
            meta = fileio.read_json(file.with_name(f"{file.stem}.meta.json"))
        except (OSError, BadInput):
            meta = {}
        meta = meta if isinstance(meta, dict) else {}
        named = meta.get("suite_file")
        suite = argument(named) if isinstance(named, str) and named else "SUITE"
        # Each run of the suite file whose rows are chosen, with the --set values it had (meta.json's set_runs,
        # matched by the rows' suite_fingerprint): a row measured under --set is measured again under it.
        listed = meta.get("set_runs")
        listed = listed if isinstance(listed, list) else []
        by_print = {r.get("fingerprint"): r.get("overrides") for r in listed if isinstance(r, dict)}
        prints = set(chosen[col.SUITE_FINGERPRINT].dropna().astype(str)) if col.SUITE_FINGERPRINT in chosen else set()
        matched = [by_print[p] for p in by_print if p in prints]
        for overrides in matched if matched and prints <= set(by_print) else [meta.get("overrides")]:
            runs.append(f"{suite} --out {argument(file.parent)}{_sets(overrides)}")
    return list(dict.fromkeys(runs))


def _sets(overrides: object) -> str:
    """``--set`` as a run had it: the same cases."""
    return "".join(
        " --set " + argument(f"{key}={','.join(str(v).lower() if isinstance(v, bool) else str(v) for v in values)}")
        for key, values in (overrides.items() if isinstance(overrides, dict) else ())
        if isinstance(values, list)
    )


def left_out(frame: pd.DataFrame, listed: int = LISTED) -> list[str]:
    """What a report says about the lines it could not use: the first ``listed`` of them, then how many more."""
    dropped = frame.attrs.get("dropped", [])
    lines = [f"left out {line}" for line in dropped[:listed]]
    if len(dropped) > listed:
        lines.append(f"left out {len(dropped) - listed} more line(s)")
    return lines
