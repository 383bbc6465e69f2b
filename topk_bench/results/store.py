"""The results file: appending a row, rewriting, and reading back only the rows that are whole.

Rows are appended one ``os.write`` each (a whole line) and fsynced, so a run
killed at any moment leaves only complete rows. The caller (the runner) holds
the file's lock while writing; readers need none. :func:`read` is the one
reader of the file: resume, ``show``, ``plot`` and ``compare`` all see the same
rows, and the same list of what was left out.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from topk_bench.results.columns import REQUIRED_COLUMNS
from topk_bench.status import STATUSES


@dataclass
class Table:
    """What :func:`read` found: the header, the valid rows, and one line per row left out."""

    header: list[str]
    rows: list[dict[str, str]]
    dropped: list[str] = field(default_factory=list)

    @property
    def missing_required(self) -> list[str]:
        return [c for c in REQUIRED_COLUMNS if c not in self.header]


def _line(values: Iterable[Any]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(["" if v is None else v for v in values])
    return buffer.getvalue()


def _write_all(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_header(path: Path) -> list[str] | None:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return next(csv.reader(f), None)
    except FileNotFoundError:
        return None


def _problem(record: list[str], header: list[str]) -> str | None:
    """Why a record is not a row of this file (None: it is one)."""
    if len(record) != len(header):
        return f"{len(record)} fields where the header has {len(header)} (a line cut by a crash?)"
    row = dict(zip(header, record))
    if "status" in row and row["status"] not in STATUSES:
        return f"unknown status {row['status']!r}"
    if "case_id" in row and not row["case_id"]:
        return "no case_id"
    return None


def read(path: Path) -> Table:
    """The rows of a results CSV that are whole and valid; an absent file is an empty table."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                return Table([], [])
            table = Table(header, [])
            for record in reader:
                if not record:
                    continue
                problem = _problem(record, header)
                if problem is None:
                    table.rows.append(dict(zip(header, record)))
                else:
                    table.dropped.append(f"{path.name} line {reader.line_num}: {problem}")
            return table
    except FileNotFoundError:
        return Table([], [])


def read_rows(path: Path) -> list[dict[str, str]]:
    """The valid rows of a results CSV (see :func:`read`)."""
    return read(path).rows


def _write_atomic(path: Path, header: list[str], rows: list[Mapping[str, Any]]) -> None:
    """Write ``rows`` under ``header`` to a copy, then atomically replace ``path`` (a reader never sees half a file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        f.write(_line(header))
        for r in rows:
            f.write(_line(r.get(c, "") for c in header))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def remove_rows(path: Path, case_ids: set[str]) -> int:
    """Drop the rows of ``case_ids`` (``--no-resume``), keeping every other row; returns how many went."""
    header = read_header(path)
    if header is None:
        return 0
    rows = read_rows(path)
    kept = [r for r in rows if r.get("case_id") not in case_ids]
    _write_atomic(path, header, kept)
    return len(rows) - len(kept)


def append_row(path: Path, row: Mapping[str, Any], header: list[str]) -> list[str]:
    """Append ``row`` to ``path`` (created with ``header`` if absent); returns the file's header.

    Columns of ``row`` missing from the file's header widen it first (one atomic rewrite).
    """
    current = read_header(path)
    if current is None or not path.stat().st_size:
        current = list(header)
        _write_all(path, _line(current).encode())
    missing = [c for c in list(header) + list(row) if c not in current]
    if missing:
        current = current + list(dict.fromkeys(missing))
        _write_atomic(path, current, read_rows(path))
    data = _line(row.get(c) for c in current).encode()
    with open(path, "rb") as f:  # a line cut by a crash of an older writer must not swallow ours
        f.seek(0, os.SEEK_END)
        if f.tell():
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                data = b"\n" + data
    _write_all(path, data)
    return current
