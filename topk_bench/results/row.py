"""One case and its measurement as one CSV row."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from topk_bench.case import Budget, Case, Measurement
from topk_bench.protocol import DEFAULT as DEFAULT_PROTOCOL
from topk_bench.results import columns as col
from topk_bench.results import rates, trust


def parameters(case: Case) -> dict[str, Any]:
    """The case's parameter columns: shape, options, the feed-forward implementation, masking, dtype, compilation,
    protocol.

    ``compile`` (and ``compile_mode``) only for a compiled case, ``protocol`` only when it is not the default,
    so that other CSVs keep their header (an eager row of a suite with compiled ones has ``compile`` empty).
    """
    row: dict[str, Any] = dict(case.params)
    row.update(case.options)
    if case.ff_impl is not None:
        row["ff_impl"] = case.ff_impl
        row.update({f"ff_{k}": v for k, v in case.ff_options})
    row.update(causal=case.causal, activation=case.activation, dtype=str(case.dtype))
    if case.compile:
        row["compile"] = True
        if case.compile_mode:
            row["compile_mode"] = case.compile_mode
    if case.protocol != DEFAULT_PROTOCOL:
        row["protocol"] = case.protocol
    return row


def context(measurement: Measurement, budget: Budget | None) -> dict[str, Any]:
    """The context columns: the machine's load around the measurement, the samples' spread, the trust flag
    (:func:`topk_bench.results.trust.flags`), the budget the case ran under (what resume compares), what its
    threads got of the machine while timed (:mod:`topk_bench.measure.contention`), and the machine and software
    it ran on (its metadata). How it was timed and its ops come with its ``extra``."""
    m, meta, budget = measurement, measurement.metadata or {}, budget or Budget()
    machine: dict[str, Any] = {key: meta.get(key) for key in (col.LOAD_START, col.LOAD_END, col.STEAL)}
    # What the case's threads got, while timed.
    seen: dict[str, Any] = {key: meta.get(key) for key in col.CONTENTION_COLUMNS}
    spread = trust.cv(m.times_s)
    evidence = {key: seen[key] for key in (col.RUNNABLE, col.CPU_WAIT, col.CPU_SHARE)}
    return {
        col.TRUST: trust.flags(**machine, **evidence, time_cv=spread) if m.times_s else "",
        col.TIME_CV: spread,
        col.ROUNDS: meta.get(col.ROUNDS, 1) if m.times_s else None,
        **machine,
        col.MAX_MEMORY_BYTES: budget.max_memory_bytes,
        col.MAX_CASE_SECONDS: budget.max_seconds,
        **seen,
        col.CODE_PATH: meta.get(col.CODE_PATH),
        **{column: meta.get(column) for column in col.MACHINE_COLUMNS},
    }


def make_row(
    case: Case,
    measurement: Measurement,
    defaults: Mapping[str, str] | None = None,
    traffic: rates.Traffic | None = None,
    budget: Budget | None = None,
) -> dict[str, Any]:
    """One CSV row. ``defaults`` fills torch_version/git_sha/device_name a measurement lacks (skipped rows);
    ``traffic``, what the case's workload says one iteration does, gives the rate columns; ``budget``: the one
    the case ran under."""
    m, meta, defaults = measurement, measurement.metadata or {}, defaults or {}
    row: dict[str, Any] = {
        col.SUITE: case.suite,
        col.CASE_ID: case.case_id,
        col.WORKLOAD: case.workload,
        col.IMPL: case.impl,
        col.LABEL: case.label,
        col.MODE: str(case.mode),
        col.DEVICE: case.device,
        col.DEVICE_NAME: m.device_name or meta.get("device_name") or defaults.get("device_name", ""),
        col.METHOD: str(case.method),
        col.STATUS: str(m.status),
        col.ERROR: " ".join(str(m.error).split())[:1000],  # one line: the CSV stays readable with grep
        col.PEAK_BYTES: m.peak_bytes,
        col.RESERVED_BYTES: m.reserved_bytes,
        col.BASELINE_BYTES: m.baseline_bytes,
        col.TIME_MEDIAN_S: m.time_median_s,
        col.TIME_IQR_S: m.time_iqr_s,
        col.TIME_MEAN_S: m.time_mean_s,
        col.TIME_MIN_S: m.time_min_s,
        col.REPEATS: len(m.times_s),
        col.TIMES_S: ";".join(repr(float(t)) for t in m.times_s),
        col.FLOPS: m.flops,
        col.TORCH_VERSION: meta.get("torch_version") or defaults.get("torch_version", ""),
        col.GIT_SHA: meta.get("git_sha") or defaults.get("git_sha", ""),
        col.TIMESTAMP: dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    row.update(parameters(case))
    row.update(rates.columns(traffic, m))
    row.update(m.extra or {})
    row.update(context(m, budget))
    return row
