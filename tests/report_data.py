"""What the report's tests share (tests/report/site/): results files written as `run` writes them (the readers'
checks apply), fast enough for 100,000 rows, with chosen medians and peaks over ``seq_len``; a suite whose
crossovers are known by hand (:func:`crossing_rows`); a history of six commits with a planted step
(:func:`history_folder`); ``topk-bench report`` run in this process (:func:`report`)."""

from __future__ import annotations

import csv
import hashlib
import json
import math
from pathlib import Path

from topk_bench.cli import main
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


SHA = [f"{i:x}" * 40 for i in range(1, 7)]  # six commits' shas: 1111..., 2222...
URL = "https://example.org/repo/commit/{sha}"


def crossing_rows(suite: str = "s", label: str = "Top-k", **extra) -> list[dict]:
    """SDPA's time 1e-9 L^2 and peak 1000 L; top-k's 4e-6 L and 1000 sqrt(3000 L): the time ratio is 4000 / L
    (1 at L = 4000), the peak ratio sqrt(3000 / L) (1 at L = 3000); power laws, so log-log interpolation is exact."""
    rows = []
    for length in (1024, 2048, 4096, 8192):
        rows.append(row("sdpa", length, 1e-9 * length**2, 1000.0 * length, suite=suite, label="PyTorch SDPA", **extra))
        rows.append(
            row("topk", length, 4e-6 * length, 1000.0 * math.sqrt(3000 * length), suite=suite, label=label, **extra)
        )
    return rows


def report(*args: str, capsys=None) -> tuple[int, str, str]:
    try:
        main(["report", *args])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    else:
        code = 0
    out, err = capsys.readouterr() if capsys is not None else ("", "")
    return code, out, err


def crossovers_csv(out: Path) -> list[dict]:
    with open(out / "crossovers.csv", newline="") as f:
        return list(csv.DictReader(f))


HOSTILE = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'


def history_folder(path: Path, verdict: dict | None = None, numbered: bool = True) -> Path:
    """Six commits: top-k's time x1.3 from the fourth on (SDPA's the same), a verdict on the fourth."""
    for i in range(6):
        rows = []
        for length in (1024, 2048):
            slow = 1.3 if i >= 3 else 1.0
            rows.append(
                row(
                    "sdpa",
                    length,
                    1e-3,
                    1e6,
                    label="PyTorch SDPA",
                    git_sha=SHA[i],
                    timestamp=f"2025-01-0{i + 1}T00:00:00Z",
                )
            )
            rows.append(
                row(
                    "topk",
                    length,
                    2e-3 * slow,
                    2e6,
                    label="Top-k",
                    git_sha=SHA[i],
                    timestamp=f"2025-01-0{i + 1}T00:00:00Z",
                )
            )
        name = f"{i + 1:04d}-{SHA[i][:7]}" if numbered else f"{'zyxwvu'[i]}-{SHA[i][:7]}"
        write(path / name, rows)
        if i == 3 and verdict is not None:
            (path / name / "verdict.json").write_text(json.dumps(verdict))
    return path
