"""What a figure shows: x column, log axes, side-by-side panels, metric rows.

Read from ``OUT/<suite>.meta.json`` (written by the runner from the suite's
``[plot]`` section) or, when there is none, inferred from the CSV: x is the
parameter that is swept. Kept apart from the drawing so that it is testable
without matplotlib and reusable by plug-in renderers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from topk_bench import fileio
from topk_bench.errors import BadInput
from topk_bench.protocol import DEFAULT as DEFAULT_PROTOCOL
from topk_bench.protocol import PROTOCOLS
from topk_bench.results import columns as col
from topk_bench.results.columns import metric, migrate_metrics, parameter_columns

# Preferred x when several parameters vary (the paper's x axes first).
_X_PREFERENCE = ("seq_len", "d_ff", "chunk_size", "topk", "nb_features", "layers", "batch", "d_model", "heads")
X_LABELS = {
    "seq_len": "sequence length",
    "d_ff": "feed-forward dimension",
    "chunk_size": "query chunk size",
    "topk": "k",
    "nb_features": "random features",
    "layers": "layers",
    "batch": "batch size",
}


MEMORY_CHOICES = ("allocated", "reserved")


@dataclass(frozen=True)
class PlotSpec:
    suite: str
    title: str
    workload: str
    x: str
    x_label: str
    log_x: int = 0  # 0: linear; otherwise the base
    log_y: bool = False
    panels: tuple[tuple[float | None, float | None], ...] = ((None, None),)
    metrics: tuple[str, ...] = ("memory", "time")
    split: tuple[str, ...] = ()  # parameters with one figure per value (the model of a suite of several)
    renderer: str | None = None  # "module:function" of a plug-in renderer
    pareto: bool = False  # also the quality-against-time figure (report/plots/pareto.py)
    # Which peak the "memory" row draws: "allocated" or "reserved" (where the rows have it): memory_metric().
    memory: str = "allocated"
    # The CSV's parameter columns, as the run recorded them (None: told apart by the column vocabulary).
    parameters: tuple[str, ...] | None = None
    # The protocol of the run (topk_bench.protocol): which columns "memory" and "time" draw.
    protocol: str = DEFAULT_PROTOCOL
    # Which suite of that name meta.json describes (Suite.fingerprint; None: not said, or no meta.json).
    fingerprint: str | None = None
    extra: dict = field(default_factory=dict, compare=False)  # the rest of meta["plot"], for plug-ins


def infer_x(frame: pd.DataFrame, file: Path) -> str:
    """The swept parameter: the one with the most distinct values (ties: the paper's order)."""
    params = [c for c in parameter_columns(frame.columns) if pd.to_numeric(frame[c], errors="coerce").notna().any()]
    if not params:
        raise BadInput("no numeric parameter column to plot against (expected e.g. seq_len or d_ff)", file=file)
    rank = {name: i for i, name in enumerate(_X_PREFERENCE)}
    return max(params, key=lambda c: (frame[c].nunique(), -rank.get(c, len(rank))))


def geometric(values: pd.Series) -> bool:
    """Sizes that grow by a factor rather than a step (1K, 2K, 4K; 1000, 4000, 16000), spanning 4x or more: on a
    linear axis the small ones' ticks would print over one another. Each size at least 1.5 times the one before
    (a step of 1024 from 1024 is 2x, then 1.5x: 1K, 2K, 3K is linear enough)."""
    sizes = sorted(set(values.dropna()))
    if len(sizes) < 2 or sizes[0] <= 0 or sizes[-1] < 4 * sizes[0]:
        return False
    return all(b >= 1.5 * a for a, b in zip(sizes, sizes[1:]))


def infer_spec(frame: pd.DataFrame, file: Path) -> PlotSpec:
    """A spec for a CSV without meta.json: x swept, a log2 axis for a geometric sweep (:func:`geometric`)."""
    x = infer_x(frame, file)
    xs = pd.to_numeric(frame[x], errors="coerce").dropna()
    log_x = 2 if geometric(xs) else 0
    peaks = pd.to_numeric(frame[col.PEAK_BYTES], errors="coerce").dropna()
    peaks = peaks[peaks > 0]
    log_y = bool(len(peaks)) and peaks.max() > 50 * peaks.min()
    suite = str(frame[col.SUITE].iloc[0]) if len(frame) else file.stem
    workload = str(frame[col.WORKLOAD].iloc[0]) if len(frame) else ""
    return PlotSpec(
        suite=suite,
        title=suite,
        workload=workload,
        x=x,
        x_label=X_LABELS.get(x, x),
        log_x=log_x,
        log_y=log_y,
        protocol=_protocol_of(frame),
    )


def _protocol_of(frame: pd.DataFrame) -> str:
    """The CSV's ``protocol`` column (written only when it is not the default), else the default."""
    values = frame["protocol"].dropna().unique() if "protocol" in frame.columns else []
    return str(values[0]) if len(values) == 1 and values[0] in PROTOCOLS else DEFAULT_PROTOCOL


def _number(value, file: Path, key: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadInput(f"expected a number or null, got {value!r}", file=file, key=key)
    return float(value)


def _metrics(metrics: object, frame: pd.DataFrame, csv_path: Path, meta_path: Path) -> list[str]:
    """``plot.metrics``: metric names whose columns the CSV has (fidelity's old names migrated)."""
    if not isinstance(metrics, list) or not all(isinstance(m, str) for m in metrics):
        raise BadInput("expected a list of metric names", file=meta_path, key="plot.metrics")
    metrics = migrate_metrics(metrics, frame.columns)  # a run whose quality columns carry fidelity's names
    for name in metrics:
        for column in metric(name).columns:
            if column not in frame.columns:
                raise BadInput(
                    f"metric {name!r} needs column {column!r}, absent from {csv_path.name}",
                    file=meta_path,
                    key="plot.metrics",
                )
    return metrics


def _log_x(log_x: object, xs: pd.Series, meta_path: Path) -> int | float:
    """``plot.log_x``: 0 (linear) or a log base; unsaid, the sweep says (a geometric one: 2)."""
    if log_x is None:  # the suite did not say: the sweep does (infer_spec)
        log_x = 2 if geometric(pd.to_numeric(xs, errors="coerce")) else 0
    if log_x is True:  # tolerate a boolean: log2, the paper's sizes are powers of two
        log_x = 2
    if not isinstance(log_x, (int, float)) or (log_x and log_x <= 1):
        raise BadInput(f"expected 0 (linear) or a log base > 1, got {log_x!r}", file=meta_path, key="plot.log_x")
    return log_x


def spec_from_meta(meta_path: Path, frame: pd.DataFrame, csv_path: Path) -> PlotSpec:
    """Read meta.json; keys it lacks fall back on what the CSV implies."""
    try:
        meta = fileio.read_json(meta_path)
    except OSError as exc:
        raise BadInput(f"cannot read: {exc.strerror or exc}", file=meta_path) from None
    if not isinstance(meta, dict) or not isinstance(meta.get("plot", {}), dict):
        raise BadInput("expected an object with a 'plot' object", file=meta_path)
    inferred = infer_spec(frame, csv_path)
    plot = dict(meta.get("plot") or {})
    x = plot.pop("x", None) or inferred.x
    if x not in frame.columns:
        raise BadInput(f"column {x!r} is not in {csv_path.name}", file=meta_path, key="plot.x")
    panels = plot.pop("panels", None) or [[None, None]]
    if not isinstance(panels, list) or not all(isinstance(p, list) and len(p) == 2 for p in panels):
        raise BadInput("expected a list of [xmin, xmax] pairs", file=meta_path, key="plot.panels")
    metrics = _metrics(plot.pop("metrics", None) or ["memory", "time"], frame, csv_path, meta_path)
    split = plot.pop("split", None) or []
    if not isinstance(split, list) or not all(isinstance(c, str) and c in frame.columns for c in split):
        raise BadInput(f"expected a list of columns of {csv_path.name}", file=meta_path, key="plot.split")
    log_x = _log_x(plot.pop("log_x", None), frame[x], meta_path)
    log_y = plot.pop("log_y", inferred.log_y)
    pareto = plot.pop("pareto", False)
    if not isinstance(pareto, bool):
        raise BadInput(f"expected true or false, got {pareto!r}", file=meta_path, key="plot.pareto")
    memory = plot.pop("memory", "allocated")
    if memory not in MEMORY_CHOICES:
        raise BadInput(
            f"expected one of {', '.join(MEMORY_CHOICES)}, got {memory!r}", file=meta_path, key="plot.memory"
        )
    protocol = meta.get("protocol", inferred.protocol)
    if protocol not in PROTOCOLS:
        raise BadInput(f"expected one of: {', '.join(PROTOCOLS)}, got {protocol!r}", file=meta_path, key="protocol")
    return PlotSpec(
        suite=str(meta.get("suite") or inferred.suite),
        title=str(meta.get("title") or meta.get("suite") or inferred.title),
        workload=str(meta.get("workload") or inferred.workload),
        x=x,
        x_label=str(plot.pop("x_label", None) or X_LABELS.get(x, x)),
        log_x=int(log_x),
        log_y=bool(log_y),
        panels=tuple(
            (_number(lo, meta_path, "plot.panels"), _number(hi, meta_path, "plot.panels")) for lo, hi in panels
        ),
        metrics=tuple(metrics),
        split=tuple(split),
        renderer=plot.pop("renderer", None),
        pareto=pareto,
        memory=memory,
        parameters=tuple(meta["parameters"]) if isinstance(meta.get("parameters"), list) else None,
        protocol=protocol,
        fingerprint=meta["fingerprint"] if isinstance(meta.get("fingerprint"), str) else None,
        extra=plot,
    )


def memory_metric(spec: PlotSpec, rows: pd.DataFrame) -> str:
    """The metric the "memory" row of a figure of ``rows`` draws: ``reserved`` when the spec asks for it and
    every measured point has a reserved peak (CUDA; the CPU and predictions of CPU cases have none), else
    ``memory`` (the allocated peak). The y label names the one drawn."""
    if spec.memory != "reserved":
        return "memory"
    ok = rows[(rows[col.STATUS] == "ok") & pd.to_numeric(rows[col.PEAK_BYTES], errors="coerce").notna()]
    reserved = pd.to_numeric(ok[col.RESERVED_BYTES], errors="coerce") if col.RESERVED_BYTES in ok else None
    return "reserved" if reserved is not None and len(ok) and reserved.notna().all() else "memory"
