"""Results files for the report's tests, written as `run` writes them (the readers' checks apply), fast enough for
100,000 rows: the rows of a suite over ``seq_len`` with chosen medians and peaks."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

from topk_bench.results import columns as col

SPREAD = (0.98, 0.99, 1.0, 1.01, 1.02)  # the samples of a case around its median


def row(
    impl: str,
    seq_len: int,
    time: float | None,
    peak: float | None,
    *,
    suite: str = "s",
    label: str = "",
    method: str = "measured",
    status: str = "ok",
    device: str = "cpu",
    git_sha: str = "0123456789abcdef0123456789abcdef01234567",
    timestamp: str = "2025-01-01T00:00:00Z",
    **params,
) -> dict:
    """One results row: its samples ``time`` x :data:`SPREAD` (median ``time``) where measured and ok."""
    case = hashlib.sha256(json.dumps([suite, impl, label, seq_len, sorted(params.items())]).encode()).hexdigest()[:16]
    timed = time is not None and status == "ok"
    measured = method == "measured"
    return {
        col.SUITE: suite,
        col.CASE_ID: case,
        col.WORKLOAD: "mha",
        col.IMPL: impl,
        col.LABEL: label,
        col.MODE: "fwd",
        col.DEVICE: device,
        col.DEVICE_NAME: "Test CPU" if device == "cpu" else "NVIDIA H100 80GB HBM3 (h100-sxm, sm90, predicted)",
        col.METHOD: method,
        col.STATUS: status,
        col.ERROR: "",
        col.PEAK_BYTES: peak,
        col.TIME_MEDIAN_S: time if timed and measured else None,
        col.TIMES_S: ";".join(f"{time * s:.9g}" for s in SPREAD) if timed and measured else "",
        col.REPEATS: len(SPREAD) if timed and measured else None,
        col.TIME_PREDICTED_S: time if timed and not measured else None,
        col.GIT_SHA: git_sha,
        col.TIMESTAMP: timestamp,
        col.TORCH_VERSION: "2.13.0",
        "seq_len": seq_len,
        **params,
    }


def write(folder: Path, rows: list[dict], suite: str = "s", meta: dict | None = None) -> Path:
    """``folder/<suite>.csv`` of ``rows`` (and its meta.json when ``meta``); returns the CSV."""
    folder.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    header = col.header([k for k in keys if col.is_parameter(k)], [col.TIME_PREDICTED_S, *keys])
    path = folder / f"{suite}.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        for r in rows:
            writer.writerow(["" if r.get(c) is None else r.get(c) for c in header])
    if meta is not None:
        (folder / f"{suite}.meta.json").write_text(json.dumps(meta))
    return path
