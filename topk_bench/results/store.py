"""The results CSV: its columns, appending a row, loading a file or a directory.

Rows are appended one ``os.write`` each (a whole line) and fsynced, so a run
killed at any moment leaves only complete rows. The caller (the runner) holds
the file's lock while writing; readers need none.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from topk_bench.case import STATUSES, Case, Measurement
from topk_bench.errors import BadInput

# Required columns, in this order, after which come one column per suite
# parameter and the optional columns a suite asks for (DESIGN.md, "Contracts").
REQUIRED_COLUMNS = (
    "suite", "case_id", "workload", "impl", "label", "mode", "device", "device_name", "method",
    "status", "error", "peak_bytes", "reserved_bytes", "baseline_bytes", "time_median_s",
    "time_iqr_s", "time_mean_s", "time_min_s", "repeats", "times_s", "flops", "torch_version",
    "git_sha", "timestamp",
)
OPTIONAL_COLUMNS = ("rel_err", "grad_cos", "fidelity_seq_len", "emb_cos", "nn_agree", "nn_spearman")
FIDELITY_COLUMNS = ("rel_err", "grad_cos", "fidelity_seq_len")
PRETRAINED_COLUMNS = ("emb_cos", "nn_agree", "nn_spearman")
# String columns pandas must not turn into numbers (a case_id can be all digits).
_TEXT = {c: str for c in ("suite", "case_id", "workload", "impl", "label", "mode", "device", "device_name",
                          "method", "status", "error", "times_s", "torch_version", "git_sha", "timestamp")}


def columns(parameter_columns: Iterable[str], optional: Iterable[str] = ()) -> list[str]:
    """Header of a suite's CSV: required, then parameters, then optional columns."""
    out = list(REQUIRED_COLUMNS)
    for name in [*parameter_columns, *optional]:
        if name not in out:
            out.append(name)
    return out


def make_row(case: Case, measurement: Measurement, parameters: Mapping[str, Any],
             defaults: Mapping[str, str] | None = None) -> dict[str, Any]:
    """One CSV row. ``defaults`` fills torch_version/git_sha/device_name a measurement lacks (skipped rows)."""
    m, meta, defaults = measurement, measurement.metadata or {}, defaults or {}
    row: dict[str, Any] = {
        "suite": case.suite, "case_id": case.case_id, "workload": case.workload, "impl": case.impl,
        "label": case.label, "mode": case.mode, "device": case.device,
        "device_name": m.device_name or meta.get("device_name") or defaults.get("device_name", ""),
        "method": case.method, "status": m.status,
        "error": " ".join(str(m.error).split())[:1000],  # one line: the CSV stays readable with grep
        "peak_bytes": m.peak_bytes, "reserved_bytes": m.reserved_bytes, "baseline_bytes": m.baseline_bytes,
        "time_median_s": m.time_median_s, "time_iqr_s": m.time_iqr_s, "time_mean_s": m.time_mean_s,
        "time_min_s": m.time_min_s, "repeats": len(m.times_s),
        "times_s": ";".join(repr(float(t)) for t in m.times_s), "flops": m.flops,
        "torch_version": meta.get("torch_version") or defaults.get("torch_version", ""),
        "git_sha": meta.get("git_sha") or defaults.get("git_sha", ""),
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    row.update(parameters)
    row.update(m.extra or {})
    return row


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


def read_rows(path: Path) -> list[dict[str, str]]:
    """Complete rows of a results CSV (a truncated last line, if any, is left out)."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                return []
            return [dict(zip(header, r)) for r in reader if len(r) == len(header)]
    except FileNotFoundError:
        return []


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


def _rewrite(path: Path, header: list[str]) -> None:
    """Widen the header (a measurement brought a new column)."""
    _write_atomic(path, header, read_rows(path))


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

    Columns of ``row`` missing from the file's header widen it first.
    """
    current = read_header(path)
    if current is None or not path.stat().st_size:
        current = list(header)
        _write_all(path, _line(current).encode())
    missing = [c for c in list(header) + list(row) if c not in current]
    if missing:
        current = current + list(dict.fromkeys(missing))
        _rewrite(path, current)
    data = _line(row.get(c) for c in current).encode()
    with open(path, "rb") as f:  # a line cut by a crash of an older writer must not swallow ours
        f.seek(0, os.SEEK_END)
        if f.tell():
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                data = b"\n" + data
    _write_all(path, data)
    return current


# ---------------------------------------------------------------- loading


def _csv_files(path: Path) -> list[Path]:
    if not path.exists():
        raise BadInput("no such file or directory", file=path)
    if path.is_dir():
        files = sorted(p for p in path.glob("*.csv") if not p.name.startswith("."))
        if not files:
            raise BadInput("no results CSV (*.csv) in this directory", file=path)
        return files
    return [path]


def load_results(path: str | Path):
    """A results CSV, or every results CSV of a directory, as one pandas DataFrame."""
    import pandas as pd

    frames = []
    for file in _csv_files(Path(path)):
        try:
            frame = pd.read_csv(file, dtype=_TEXT, keep_default_na=False, na_values=[""])
        except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
            raise BadInput(f"unreadable CSV ({type(exc).__name__}: {exc})", file=file) from None
        missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
        if missing:
            raise BadInput(f"not a topk-bench results file: no column {missing[0]!r}", file=file)
        frame = frame[frame["status"].isin(STATUSES)]  # a truncated last line has no valid status
        for column in ("error", "label", "times_s", "device_name", "git_sha"):
            frame[column] = frame[column].fillna("")
        frames.append(frame)
    frame = pd.concat(frames, ignore_index=True, sort=False) if len(frames) > 1 else frames[0].reset_index(drop=True)
    # Required columns first, whatever order the files had.
    return frame[[*REQUIRED_COLUMNS, *[c for c in frame.columns if c not in REQUIRED_COLUMNS]]]
