"""A case's profile on disk, ``DIR/<case_id>/``: written by the child that ran it, read by the parent.

- ``peak.csv``: the peak's rows (:mod:`.rows`);
- ``profile.json``: what the summary needs besides the rows: the case, its peak and baseline, when the
  peak came, the counts per iteration, the story, notes;
- ``timeline.json``: live memory over the iteration's ops (:mod:`.timeline`), which the parent draws as
  ``timeline.png`` (:mod:`topk_bench.report.plots.timeline`);
- measured: ``ops.csv`` and ``trace.json`` (:mod:`.timing`); on CUDA ``snapshot.pickle``, the allocator's
  memory snapshot with its history (pytorch.org/memory_viz).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

from topk_bench import fileio
from topk_bench.capture import rows as peak_rows
from topk_bench.capture import sources, summary, timeline
from topk_bench.case import Case, Measurement
from topk_bench.results import columns as col
from topk_bench.results import stage_cells
from topk_bench.results.row import parameters

META = "profile.json"  # topk_bench.results.frame.PROFILE_FILE: show and plot pass over its directory
PEAK = "peak.csv"
TIMELINE = "timeline.json"
SNAPSHOT = "snapshot.pickle"
# Parameters that say how large a case is, named in what it is ("vanilla at seq_len=16384").
SIZES = ("seq_len", "kv_len", "new_tokens", "budget", "d_ff", "layers")


def what(case: Case) -> str:
    """``topk (topk=128, chunk_size=1024) at seq_len=65536``."""
    options = ", ".join(f"{k}={v}" for k, v in case.options if v is not None and not isinstance(v, (list, dict)))
    params = case.param_dict
    sizes = ", ".join(f"{k}={params[k]}" for k in SIZES if k in params)
    return f"{case.impl}{f' ({options})' if options else ''}{f' at {sizes}' if sizes else ''}"


def _peak_in(captured) -> tuple[str, int | None]:
    tracker = captured.attribution
    if tracker is None or not tracker.peak_at:
        return "-", None
    op = tracker.steps[tracker.peak_at - 1][0]
    backward = tracker.backward_from is not None and op >= tracker.backward_from
    return ("backward" if backward else "forward"), op


def stages(result: Measurement) -> dict[str, dict[str, float | None]]:
    """Each marked stage's seconds and peak (``{"forward.indexer": {"time_s": ..., "peak_bytes": ...}}``), from the
    row's per-stage columns; empty for an implementation that marks none."""
    times = stage_cells.read(result.extra.get(col.STAGE_TIMES_S))
    peaks = stage_cells.read(result.extra.get(col.STAGE_PEAK_BYTES))
    return {
        key: {"time_s": times.get(key), "peak_bytes": int(peaks[key]) if key in peaks else None}
        for key in sorted({*times, *peaks})
    }


def meta(case: Case, result: Measurement, captured) -> dict[str, Any]:
    peak_in, peak_op = _peak_in(captured)
    rows = captured.rows
    above = sum(r.bytes for r in rows)
    places = sources.Sources(sources.user_files((case.impl, case.ff_impl or ""), case.plugins))
    user = sum(r.bytes for r in rows if places.names_user_line(r.source))
    return {
        "case_id": case.case_id,
        "suite": case.suite,
        "what": what(case),
        "impl": case.impl,
        "label": case.label,
        "workload": case.workload,
        "mode": str(case.mode),
        "parameters": parameters(case),
        "method": str(case.method),
        "device": case.device,
        "protocol": case.protocol,
        "peak_bytes": result.peak_bytes,
        "baseline_bytes": result.baseline_bytes,
        "reserved_bytes": result.reserved_bytes,
        "rows_bytes": above,
        "user_share": user / above if above else 1.0,
        "peak_in": peak_in,
        "peak_op": peak_op,
        "ops_per_iteration": captured.attribution.ops if captured.attribution else None,
        "profiled_aten_ops": captured.timing.aten_ops if captured.timing else None,
        "kernel_launches": captured.timing.kernel_launches if captured.timing else None,
        "stages": stages(result),
        "story": summary.story(what(case), rows, result.peak_bytes or 0, result.baseline_bytes or 0),
        "notes": list(captured.notes),
    }


def write(directory: Path, case: Case, result: Measurement, captured) -> None:
    """Every file of the profile; each written whole or not at all."""
    directory.mkdir(parents=True, exist_ok=True)
    peak_rows.write(directory / PEAK, captured.rows)
    info = meta(case, result, captured)
    fileio.write_atomic(directory / META, (json.dumps(info, indent=2) + "\n").encode())
    if captured.attribution is not None:
        timeline.write(directory / TIMELINE, captured.attribution, info["what"])
    if captured.timing is not None:
        captured.timing.write(directory)
    if captured.snapshot is not None:
        fileio.write_atomic(directory / SNAPSHOT, pickle.dumps(captured.snapshot))


def read(directory: Path) -> tuple[dict[str, Any], list[peak_rows.Row]]:
    """(profile.json, the rows of peak.csv) of a profile written by :func:`write`."""
    info = json.loads((directory / META).read_text())
    return info, peak_rows.read(directory / PEAK)
