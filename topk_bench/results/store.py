"""The results file: appending a row, rewriting, and reading back only the rows that are whole and valid.

Writing: every row is one physical line (a line break inside a value becomes a
space), appended whole or not at all and fsynced (:func:`topk_bench.fileio.append`):
a run killed at any moment, or a disk that fills, leaves only complete rows. A
new file gets its header and first row in one atomic write, and a rewrite (a
widened header, ``--no-resume``) keeps every line it does not understand as it
was. The caller (the runner) holds the file's lock while writing; readers need none.

Reading: :func:`read` is the one reader of the file: resume, ``show``, ``plot``
and ``compare`` all see the same rows, and the same list of what was left out.
Each line is read on its own (a damaged line cannot swallow the next), and a row
is kept only when it has as many fields as the header, a known status, a
``case_id``, and numbers where the vocabulary has numbers
(:func:`topk_bench.results.columns.cell_problem`).
"""

from __future__ import annotations

import csv
import io
import os
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from topk_bench import fileio
from topk_bench.errors import BadInput, file_error
from topk_bench.results import columns as col
from topk_bench.results.columns import REQUIRED_COLUMNS, cell_checker, migrate
from topk_bench.status import STATUSES


@dataclass
class Table:
    """What :func:`read` found: the header, the valid rows (and their line numbers), one line per line left out."""

    header: list[str]
    rows: list[dict[str, str]]
    dropped: list[str] = field(default_factory=list)
    line_numbers: list[int] = field(default_factory=list)
    # (line number, fields) of the lines whose field count is not the header's; how many lines have the header's
    misfits: list[tuple[int, int]] = field(default_factory=list)
    whole: int = 0

    def header_problem(self) -> str | None:
        """Why rows appended under this header would not line up with the file's rows (None: they would).

        A crash cuts at most the line being written: a line longer than the
        header, or more short lines than whole ones, means the header is damaged.
        """
        width = len(self.header)
        longer = [(n, f) for n, f in self.misfits if f > width]
        if longer:
            n, fields = longer[0]
            return (
                f"the header has {width} columns but line {n} has {fields} fields ({len(longer)} line(s) longer "
                "than the header): the header is damaged; repair it (or use another --out) before running"
            )
        if len(self.misfits) > self.whole:
            n, fields = self.misfits[0]
            return (
                f"the header has {width} columns but {len(self.misfits)} line(s) have fewer (line {n}: {fields}) "
                f"and only {self.whole} as many: the header is damaged; repair it (or use another --out) "
                "before running"
            )
        return None


# A cell a spreadsheet would run as a formula (=, +, -, @, a tab or a carriage return first: OWASP's list) is
# written with a "'" before it, which a spreadsheet shows as text; so is one that already starts with "'" before
# one of those, so that the rule reads back exactly: one "'" is taken off a cell that reads '+X (quotes, then
# one of those). A number (-1, +2.5e-3) is no formula: written as it is.
_FORMULA_FIRST = "=+-@\t\r"
_QUOTED_FORMULA = re.compile("^'+[" + re.escape(_FORMULA_FIRST) + "]")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def spreadsheet_safe(text: str) -> str:
    """``text`` as written in a cell: ``'`` before a formula (:data:`_FORMULA_FIRST` first, not a number) and
    before a cell that already reads like one escaped this way; anything else as it is."""
    if text and (text[0] in _FORMULA_FIRST and not _is_number(text) or _QUOTED_FORMULA.match(text)):
        return "'" + text
    return text


def from_spreadsheet_safe(text: str) -> str:
    """The original text of a cell :func:`spreadsheet_safe` wrote: one ``'`` less before a formula."""
    return text[1:] if text.startswith("'") and _QUOTED_FORMULA.match(text) else text


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    return spreadsheet_safe(" ".join(value.splitlines())) if isinstance(value, str) else value


def _line(values: Iterable[Any]) -> bytes:
    """One CSV line: a value's own line breaks become spaces, so that a row is always one physical line."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow([_cell(v) for v in values])
    return buffer.getvalue().encode("utf-8")


def _read_bytes(path: Path) -> bytes | None:
    """The file's bytes; None when there is no file. A FIFO, a device, a directory or a file larger than
    :data:`topk_bench.fileio.CSV_LIMIT` is bad input (never blocks, never exhausts memory)."""
    try:
        return fileio.read_regular(path, fileio.CSV_LIMIT)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise BadInput("expected a results CSV file, got a directory", file=path) from None
    except OSError as exc:
        raise file_error(exc, "cannot read", file=path) from None


# A cell as long as the file may be: the csv module's default (128 KiB) would refuse a long label this module wrote.
csv.field_size_limit(fileio.CSV_LIMIT)


def _fields(line: bytes) -> list[str]:
    """One line's fields; ValueError when it is not UTF-8 text or not one CSV record."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    if '"' not in text and "\r" not in text:  # nothing quoted: the csv module would split at every comma too
        fields = text.split(",")
    else:
        try:
            fields = next(csv.reader([text], strict=True))
        except csv.Error as exc:
            raise ValueError(f"not a CSV record ({exc})") from None
    return [from_spreadsheet_safe(f) for f in fields] if "'" in text else fields


def _header(first: bytes, path: Path) -> list[str]:
    try:
        header = _fields(first.removeprefix(b"\xef\xbb\xbf"))  # a byte-order mark from a spreadsheet
    except ValueError as exc:
        raise BadInput(f"not a topk-bench results file: its header (line 1) is {exc}", file=path) from None
    duplicates = sorted({c for c in header if header.count(c) > 1})
    if duplicates:
        raise BadInput(
            f"not a topk-bench results file: column {duplicates[0]!r} appears twice in the header", file=path
        )
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise BadInput(f"not a topk-bench results file: no column {str(missing[0])!r}", file=path)
    return migrate(header)  # quality columns under fidelity's names, renamed


def _problem(
    record: list[str], header: list[str], numbers: list[tuple[int, Callable[[str], str | None]]]
) -> str | None:
    """Why a record is not a row of this file (None: it is one); ``numbers``: the columns that hold numbers, each
    with its check (:func:`topk_bench.results.columns.cell_checker`)."""
    if len(record) != len(header):
        why = "a line cut by a crash?" if len(record) < len(header) else "a damaged header?"
        return f"{len(record)} fields where the header has {len(header)} ({why})"
    status = record[header.index(col.STATUS)]
    if status not in STATUSES:
        return f"unknown status {status!r}"
    if not record[header.index(col.CASE_ID)]:
        return "no case_id"
    for i, check in numbers:
        problem = check(record[i])
        if problem:
            return problem
    return None


def _lines(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of every non-blank line, a trailing carriage return removed."""
    for number, line in enumerate(data.split(b"\n"), start=1):
        line = line.removesuffix(b"\r")
        if line.strip():
            yield number, line


def _records(data: bytes, path: Path) -> tuple[list[str], Iterator[tuple[int, bytes, list[str] | None, str | None]]]:
    """The header, then (line number, line, fields or None, problem or None) of every line after it."""
    lines = _lines(data)
    first = next(lines, None)
    if first is None:
        return [], iter(())
    header = _header(first[1], path)
    numbers = [(i, check) for i, column in enumerate(header) if (check := cell_checker(column)) is not None]

    def records():
        for number, line in lines:
            try:
                fields = _fields(line)
            except ValueError as exc:
                yield number, line, None, str(exc)
                continue
            yield number, line, fields, _problem(fields, header, numbers)

    return header, records()


def read(path: Path) -> Table:
    """The rows of a results CSV that are whole and valid; an absent or empty file is an empty table.

    Raises BadInput when the file cannot be a results CSV at all (not a regular
    file, unreadable, a header without the required columns).
    """
    path = Path(path)
    data = _read_bytes(path)
    header, records = _records(data or b"", path)
    table = Table(header, [])
    for number, _, fields, problem in records:
        if fields is not None and len(fields) != len(header):
            table.misfits.append((number, len(fields)))
        elif fields is not None:
            table.whole += 1
        if problem is None:
            assert fields is not None, "a line without a problem was read into fields"
            table.rows.append(dict(zip(header, fields)))
            table.line_numbers.append(number)
        else:
            table.dropped.append(f"{path.name} line {number}: {problem}")
    return table


def read_rows(path: Path) -> list[dict[str, str]]:
    """The valid rows of a results CSV (see :func:`read`)."""
    return read(path).rows


def read_header(path: Path) -> list[str] | None:
    """The header of a results CSV; None when there is no file or it is empty."""
    try:
        with fileio.open_regular(path, fileio.CSV_LIMIT) as f:
            first = f.readline()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise BadInput("expected a results CSV file, got a directory", file=path) from None
    except OSError as exc:
        raise file_error(exc, "cannot read", file=path) from None
    first = first.removesuffix(b"\n").removesuffix(b"\r")
    return _header(first, path) if first.strip() else None


def _rewrite(
    path: Path, header: list[str], drop: Collection[str] = frozenset(), drop_lines: Collection[int] = frozenset()
) -> int:
    """Rewrite the file under ``header`` (one atomic write); returns how many rows of ``drop`` (case_ids) went.
    ``drop_lines``: line numbers of valid rows that go too.

    Valid rows are written again under the new header; every line a reader
    leaves out keeps its cells: a rewrite never loses a line it does not understand. One
    of the old header's width (a row of another version) is laid out under the new header
    with the rest, its new cells empty, so that it cannot later pass for a line cut by a
    crash (more such lines than whole ones would make the file look damaged); any other
    (a cut line, not CSV) stays byte for byte.
    """
    old, records = _records(_read_bytes(path) or b"", path)
    lines = [_line(header)]
    removed = 0
    for number, line, fields, problem in records:
        if problem is None and number in drop_lines:
            removed += 1
            continue
        if problem is not None:
            if fields is not None and len(fields) == len(old) and header != old:  # whole, under the old header
                lines.append(_line(dict(zip(old, fields)).get(c, "") for c in header))
            else:
                lines.append(line + b"\n")
            continue
        assert fields is not None, "a line without a problem was read into fields"
        row = dict(zip(old, fields))
        if row[col.CASE_ID] in drop:
            removed += 1
        else:
            lines.append(_line(row.get(c, "") for c in header))
    fileio.write_atomic(path, b"".join(lines))
    return removed


def remove_rows(path: Path, case_ids: set[str]) -> int:
    """Drop the rows of ``case_ids``, keeping every other line; returns how many went."""
    header = read_header(path)
    return 0 if header is None else _rewrite(path, header, set(case_ids))


def copy_rows(path: Path, to: Path, case_ids: set[str]) -> int:
    """Append the valid rows of ``case_ids`` to the results file ``to`` as they are (its header widened to
    theirs), leaving ``path`` as it is; a row already in ``to`` (every cell the same: a run interrupted and
    started again) is not appended twice. Returns how many were appended."""
    table = read(path)
    kept = {_cells(row) for row in read(to).rows} if to.exists() else set()
    copying = [row for row in table.rows if row[col.CASE_ID] in case_ids and _cells(row) not in kept]
    if not copying:
        return 0
    try:
        to.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise file_error(exc, "cannot create the folder", file=to.parent) from None
    header = list(table.header)
    for row in copying:
        header = append_row(to, row, header)
    return len(copying)


def _cells(row: Mapping[str, str]) -> tuple:
    """A row's filled cells: the same row whatever columns a header widened later adds (empty)."""
    return tuple(sorted((name, value) for name, value in row.items() if value))


def drop_superseded(path: Path, case_ids: set[str]) -> int:
    """Of each case in ``case_ids`` with more than one row, keep the last (the newest: rows are appended);
    returns how many went. A run measuring cases again (``--no-resume``, a retried failure) appends their new
    rows and only then drops the old ones, so that an interrupted run loses no measurement."""
    table = read(path)
    last = {row[col.CASE_ID]: number for row, number in zip(table.rows, table.line_numbers)}
    older = {
        number
        for row, number in zip(table.rows, table.line_numbers)
        if row[col.CASE_ID] in case_ids and last[row[col.CASE_ID]] != number
    }
    return _rewrite(path, table.header, drop_lines=older) if older else 0


def append_row(path: Path, row: Mapping[str, Any], header: list[str]) -> list[str]:
    """Append ``row`` to ``path`` (created with ``header`` if absent); returns the file's header.

    Columns of ``row`` missing from the file's header widen it first (one atomic
    rewrite). A row that cannot be written whole (a full disk) is not written at
    all, and raises BadInput naming the file.
    """
    current = read_header(path)
    try:
        if current is None:
            current = list(dict.fromkeys([*header, *row]))
            fileio.write_atomic(path, _line(current) + _line(row.get(c) for c in current))
            return current
        missing = [c for c in list(header) + list(row) if c not in current]
        if missing:
            current = current + list(dict.fromkeys(missing))
            _rewrite(path, current)
        data = _line(row.get(c) for c in current)
        with open(path, "rb") as f:  # a line cut by an older writer's crash must not swallow ours
            f.seek(0, os.SEEK_END)
            if f.tell():
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    data = b"\n" + data
        fileio.append(path, data)
    except OSError as exc:
        raise file_error(
            exc,
            "cannot write a row",
            file=path,
            hint="that row is not in the file and the rows before it are whole: run again to resume once this is fixed",
        ) from None
    return current
