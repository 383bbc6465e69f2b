"""Results as a pandas DataFrame: one CSV, or every results CSV of a directory, read through :func:`store.read`."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pandas as pd

from topk_bench.errors import BadInput
from topk_bench.results import store
from topk_bench.results.columns import REQUIRED_COLUMNS, TEXT_COLUMNS


def csv_files(path: Path) -> list[Path]:
    """The results CSVs a path names: the file itself, or a directory's ``*.csv`` (hidden files excluded)."""
    if not path.exists():
        raise BadInput("no such file or directory", file=path)
    if path.is_dir():
        files = sorted(p for p in path.glob("*.csv") if not p.name.startswith(".") and p.is_file())
        if not files:
            raise BadInput("no results CSV (*.csv) in this directory (run `topk-bench run SUITE.toml --out DIR` first)",
                           file=path)
        return files
    return [path]


def _frame(table: store.Table, file: Path) -> pd.DataFrame:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(table.header)
    writer.writerows([row[c] for c in table.header] for row in table.rows)
    buffer.seek(0)
    # Only an empty cell is missing: a label "NA" or "null" stays text.
    frame = pd.read_csv(buffer, dtype={c: str for c in TEXT_COLUMNS}, keep_default_na=False, na_values=[""])
    for column in ("error", "label", "times_s", "device_name", "git_sha"):
        frame[column] = frame[column].fillna("")
    frame.attrs["dropped"] = list(table.dropped)
    frame.attrs["files"] = [str(file)]
    return frame


def load_results(path: str | Path) -> pd.DataFrame:
    """A results CSV, or every results CSV of a directory, as one DataFrame (required columns first).

    ``frame.attrs["dropped"]`` lists the lines left out (cut, or with an unknown status).
    """
    frames = []
    for file in csv_files(Path(path)):
        try:
            table = store.read(file)
        except (OSError, UnicodeDecodeError, csv.Error) as exc:
            raise BadInput(f"unreadable CSV ({type(exc).__name__}: {exc})", file=file) from None
        if not table.header:
            raise BadInput("empty file, expected a header with the results columns", file=file)
        if table.missing_required:
            raise BadInput(f"not a topk-bench results file: no column {table.missing_required[0]!r}", file=file)
        frames.append(_frame(table, file))
    if len(frames) == 1:
        frame = frames[0]
    else:
        frame = pd.concat(frames, ignore_index=True, sort=False)
        frame.attrs["dropped"] = [line for f in frames for line in f.attrs["dropped"]]
        frame.attrs["files"] = [name for f in frames for name in f.attrs["files"]]
    return frame[[*REQUIRED_COLUMNS, *[c for c in frame.columns if c not in REQUIRED_COLUMNS]]]
