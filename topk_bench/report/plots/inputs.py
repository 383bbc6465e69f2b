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
from topk_bench.untrusted import file_name, is_name, shown


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
        """The file name without its format: ``<suite>[-<split values>][-<figure>]-<device>-<method>``, each part
        as the files say it where it may be part of a file's name (:func:`topk_bench.untrusted.file_name`: a suite
        named ``../x`` or ``/tmp/x`` in meta.json or the CSV, a model named ``a/b``, stay in the output folder)."""
        # A name as is (llama-3-8b), a number with its column (batch8).
        parts = [str(v) if isinstance(v, str) else f"{c}{_number(v)}" for c, v in zip(self.spec.split, self.split)]
        return file_name(self.spec.suite, *parts, *([figure] if figure else []), self.device, self.method)


def _number(value) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _of_other_suites(frame: pd.DataFrame, spec: PlotSpec) -> int:
    """How many rows another suite of the same name wrote (a suite_fingerprint other than meta.json's)."""
    if spec.fingerprint is None or col.SUITE_FINGERPRINT not in frame.columns:
        return 0
    written = frame[col.SUITE_FINGERPRINT].fillna("")
    return int(((written != "") & (written != spec.fingerprint)).sum())


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
        others = _of_other_suites(frame, spec)
        if warn and others:
            warn(
                f"{csv}: {others} row(s) written by another suite named {shown(repr(spec.suite))} (another "
                f"suite_fingerprint than {meta.name}'s {spec.fingerprint}: run --append): drawn with this suite's "
                "settings"
            )
        if warn and not is_name(spec.suite):
            warn(
                f"{meta if meta.exists() else csv}: suite: {shown(repr(spec.suite))} is no suite name (letters, "
                f"digits, '_', '.', '-'; at most 200): its figures are named {file_name(spec.suite)}-..."
            )
        keys = [col.DEVICE, col.METHOD, *spec.split]
        runs = tuple(runs_of(frame, (frame[col.METHOD] == Method.MEASURED) & (frame[col.TRUST] != "")))
        for values, rows in frame.groupby(keys, sort=True, dropna=False):
            device, method, *split = values
            rows = rows.reset_index(drop=True)
            inputs.append(FigureInput(spec, str(device), str(method), rows, tuple(split), runs=runs))
    return inputs
