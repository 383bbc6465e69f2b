"""The per-stage cells of a row (``stage_times_s``, ``stage_peak_bytes``): JSON objects keyed ``forward.<stage>`` /
``backward.<stage>``, keys sorted (docs/CONTRACTS.md, "Per-stage cost"). Written by :mod:`topk_bench.measure.stages`,
read by the per-stage figure; no torch here, so that readers stay light."""

from __future__ import annotations

import json

from topk_bench.results import columns as col


def cells(times: dict[str, float] | None, peaks: dict[str, int] | None) -> dict[str, str]:
    """The row's per-stage columns; a missing or empty part is left out."""
    out = {}
    if times:
        out[col.STAGE_TIMES_S] = json.dumps({k: round(v, 9) for k, v in sorted(times.items())})
    if peaks:
        out[col.STAGE_PEAK_BYTES] = json.dumps(dict(sorted(peaks.items())))
    return out


def read(cell: object) -> dict[str, float]:
    """A per-stage cell back as ``{"forward.indexer": value, ...}`` (empty for an empty or missing cell)."""
    if not isinstance(cell, str) or not cell.strip():
        return {}
    return {str(k): float(v) for k, v in json.loads(cell).items()}
