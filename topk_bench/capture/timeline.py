"""Live bytes over the iteration's ops, stacked by source line, as data: ``timeline.json``, which the parent draws
as ``timeline.png`` (:mod:`topk_bench.report.plots.timeline`), so that the child imports no plotting library.

Each band is one source line's live storages (the largest lines at the peak; the rest as one band); the
inputs and parameters are the first band.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from topk_bench import fileio
from topk_bench.capture.attribution import Attribution, Phase
from topk_bench.capture.sources import label

BANDS = 10  # source lines drawn on their own; the others are one band
POINTS = 500  # at most this many points across (each the highest moment of its span of ops)
BASELINE_BAND = "inputs and parameters"
OTHER_BAND = "other lines"


@dataclass
class Series:
    ops: np.ndarray  # x: op indices, each op once
    bands: list[str]  # bottom first
    live: np.ndarray  # [bands, points]: live bytes of each band at the highest moment of each span of ops
    backward_from: int | None  # the first op of the backward
    peak_op: int  # the op at which the peak was reached
    peak_bytes: int
    at_peak: np.ndarray  # [bands]: live bytes of each band at the moment of the peak


def _band_of(tracker: Attribution) -> dict[int, str]:
    return {
        serial: BASELINE_BAND if s.phase is Phase.BASELINE else label(s.where) for serial, s in tracker.storages.items()
    }


def series(tracker: Attribution, bands: int = BANDS, least: float = 0.01) -> Series:
    """The stacked live bytes by source line, one point per span of ops (its highest moment: an op that allocates and
    frees
    shows what it held). Lines drawn on their own: the ``bands`` largest at their own highest, each at least
    ``least`` of the peak above the baseline; the others are one band."""
    band_of = _band_of(tracker)
    names = list(dict.fromkeys([BASELINE_BAND, *band_of.values()]))
    index = {name: i for i, name in enumerate(names)}
    steps = tracker.steps
    deltas = np.zeros((len(names), len(steps)), dtype=np.float64)
    for i, (_, step) in enumerate(steps):
        storage = tracker.storages[abs(step)]
        deltas[index[band_of[abs(step)]], i] = storage.nbytes if step > 0 else -storage.nbytes
    live = np.cumsum(deltas, axis=1)
    above = max(tracker.peak_bytes - tracker.baseline_bytes, 1)
    highest = live.max(axis=1, initial=0)
    ranked = sorted((i for i in range(1, len(names)) if highest[i] >= least * above), key=lambda i: -highest[i])
    top = ranked[:bands]
    rest = [i for i in range(1, len(names)) if i not in top]
    rows = [live[0], *(live[i] for i in top)] + ([live[rest].sum(axis=0)] if rest else [])
    stacked = np.vstack(rows) if len(steps) else np.zeros((len(rows), 0))
    chosen = _highest_per_op(np.array([op for op, _ in steps], dtype=np.int64), stacked.sum(axis=0))
    labels = [BASELINE_BAND, *(names[i] for i in top)] + ([OTHER_BAND] if rest else [])
    peak_op = int(steps[tracker.peak_at - 1][0]) if tracker.peak_at else 0
    at_peak = stacked[:, tracker.peak_at - 1] if tracker.peak_at else np.zeros(len(labels))
    ops = np.array([steps[i][0] for i in chosen], dtype=np.int64)
    return Series(ops, labels, stacked[:, chosen], tracker.backward_from, peak_op, tracker.peak_bytes, at_peak)


def _highest_per_op(ops: np.ndarray, totals: np.ndarray, points: int = POINTS) -> list[int]:
    """For each span of ops (each op, or ``len / points`` of them on a long iteration), the step at which the total
    was highest: a storage that lives for a few ops stays visible, whatever the iteration's length."""
    span = max(1, -(-int(ops.max(initial=0)) // points))
    chosen: list[int] = []
    for i, op in enumerate(ops):
        if chosen and ops[chosen[-1]] // span == op // span:
            if totals[i] > totals[chosen[-1]]:
                chosen[-1] = i
        else:
            chosen.append(i)
    return chosen


def write(path: Path, tracker: Attribution, title: str) -> None:
    """The series of ``tracker`` and the figure's title as JSON."""
    data = series(tracker)
    fileio.write_atomic(
        path,
        json.dumps(
            {
                "title": title,
                "ops": data.ops.tolist(),
                "bands": data.bands,
                "live": data.live.tolist(),
                "backward_from": data.backward_from,
                "peak_op": data.peak_op,
                "peak_bytes": data.peak_bytes,
                "at_peak": data.at_peak.tolist(),
            }
        ).encode(),
    )


def read(path: Path) -> tuple[Series, str]:
    """(the series, the title) of a file :func:`write` wrote."""
    raw = json.loads(path.read_text())
    bands = raw["bands"]
    live = np.array(raw["live"], dtype=np.float64).reshape(len(bands), len(raw["ops"]))
    return Series(
        np.array(raw["ops"], dtype=np.int64),
        bands,
        live,
        raw["backward_from"],
        raw["peak_op"],
        raw["peak_bytes"],
        np.array(raw["at_peak"], dtype=np.float64),
    ), raw["title"]
