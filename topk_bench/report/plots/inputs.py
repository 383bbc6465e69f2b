"""The inputs of ``topk-bench plot``: every results CSV of a directory (through the one results loader),
its meta.json, split per device and method.

Each problem (no directory, no CSV, a CSV without the required columns) is a
BadInput naming the file, so the CLI prints one line and exits 2.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from topk_bench.errors import BadInput
from topk_bench.report.plots.spec import PlotSpec, infer_spec, spec_from_meta
from topk_bench.results import columns as col
from topk_bench.results.frame import csv_files, left_out, load_results, results_folders, runs_of
from topk_bench.types import Method


@dataclass
class FigureInput:
    """Rows of one suite for one (device, method), and one value of each of the spec's ``split`` columns: one figure."""

    spec: PlotSpec
    device: str
    method: str
    rows: pd.DataFrame
    split: tuple = ()  # the values of spec.split, in its order
    folder: Path = Path()  # where its files go under the output directory: the CSV's sub-folder of RESULTS
    runs: tuple[str, ...] = ()  # the `run` arguments that measure its flagged rows again (results.frame.runs_of)

    @property
    def stem(self) -> str:
        return self.named()

    def named(self, figure: str = "") -> str:
        """The file name without its format: ``<suite>[-<split values>][-<figure>]-<device>-<method>``."""
        # A name as is (llama-3-8b), a number with its column (batch8).
        parts = [str(v) if isinstance(v, str) else f"{c}{_number(v)}" for c, v in zip(self.spec.split, self.split)]
        return "-".join([self.spec.suite, *parts, *([figure] if figure else []), self.device, self.method])


def _number(value) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def figure_inputs(path: Path, warn: Callable[[str], None] | None = None) -> list[FigureInput]:
    """One FigureInput per (suite CSV, device, method, split values), in a stable order; ``warn`` hears of every
    line left out. A directory's sub-folders too (:func:`results_folders`), each drawn into the same sub-folder
    of the output."""
    inputs = []
    for folder in results_folders(path):
        where = folder.relative_to(path) if folder != path else Path()
        inputs += [dataclasses.replace(item, folder=where) for item in _inputs(folder, warn)]
    return inputs


def _inputs(path: Path, warn: Callable[[str], None] | None) -> list[FigureInput]:
    inputs = []
    for csv in csv_files(path):
        frame = load_results(csv)
        if warn:
            for line in left_out(frame):
                warn(line)
        if frame.empty:
            raise BadInput("results CSV has no rows", file=csv)
        meta = csv.with_name(f"{csv.stem}.meta.json")
        spec = spec_from_meta(meta, frame, csv) if meta.exists() else infer_spec(frame, csv)
        keys = [col.DEVICE, col.METHOD, *spec.split]
        runs = tuple(runs_of(frame, (frame[col.METHOD] == Method.MEASURED) & (frame[col.TRUST] != "")))
        for values, rows in frame.groupby(keys, sort=True, dropna=False):
            device, method, *split = values
            rows = rows.reset_index(drop=True)
            inputs.append(FigureInput(spec, str(device), str(method), rows, tuple(split), runs=runs))
    return inputs
