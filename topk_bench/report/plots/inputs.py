"""The inputs of ``topk-bench plot``: every results CSV of a directory, its meta.json, split per device and method.

Each problem (no directory, no CSV, a CSV without the required columns) is a
BadInput naming the file, so the CLI prints one line and exits 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from topk_bench.errors import BadInput
from topk_bench.plot_spec import PlotSpec, infer_spec, spec_from_meta
from topk_bench.results import REQUIRED_COLUMNS


@dataclass
class FigureInput:
    """Rows of one suite for one (device, method): one figure."""

    spec: PlotSpec
    device: str
    method: str
    rows: pd.DataFrame

    @property
    def stem(self) -> str:
        return f"{self.spec.suite}-{self.device}-{self.method}"


def find_csvs(path: Path) -> list[Path]:
    """The results CSVs of a directory (a single CSV file is accepted too)."""
    if not path.exists():
        raise BadInput("no such results directory", file=path)
    if path.is_file():
        if path.suffix != ".csv":
            raise BadInput("expected a results directory or a .csv file", file=path)
        return [path]
    csvs = sorted(path.glob("*.csv"))
    if not csvs:
        raise BadInput("no results CSV in this directory (run `topk-bench run SUITE.toml --out DIR` first)", file=path)
    return csvs


def read_csv(path: Path) -> pd.DataFrame:
    try:
        frame = pd.read_csv(path, keep_default_na=True)
    except (OSError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        raise BadInput(f"unreadable CSV ({str(exc).splitlines()[0]})", file=path) from None
    except pd.errors.EmptyDataError:
        raise BadInput("empty CSV, expected a header with the results columns", file=path) from None
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise BadInput(f"not a results CSV: missing required columns {', '.join(missing)}", file=path)
    if frame.empty:
        raise BadInput("results CSV has no rows", file=path)
    return frame


def figure_inputs(path: Path) -> list[FigureInput]:
    """One FigureInput per (suite CSV, device, method), in a stable order."""
    inputs = []
    for csv in find_csvs(path):
        frame = read_csv(csv)
        meta = csv.with_name(f"{csv.stem}.meta.json")
        spec = spec_from_meta(meta, frame, csv) if meta.exists() else infer_spec(frame, csv)
        frame = frame.assign(device=frame["device"].fillna("unknown").astype(str),
                             method=frame["method"].fillna("unknown").astype(str))
        for (device, method), rows in frame.groupby(["device", "method"], sort=True):
            inputs.append(FigureInput(spec, device, method, rows.reset_index(drop=True)))
    return inputs
