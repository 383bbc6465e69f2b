"""One case and its measurement as one CSV row."""

from __future__ import annotations

import datetime as dt
from typing import Any, Mapping

from topk_bench.case import Budget, Case, Measurement
from topk_bench.protocol import DEFAULT as DEFAULT_PROTOCOL
from topk_bench.results import rates, trust


def parameters(case: Case) -> dict[str, Any]:
    """The case's parameter columns: shape, options, the feed-forward implementation, masking, dtype, protocol.

    ``protocol`` only when it is not the default, so that our protocol's CSVs keep their header.
    """
    row: dict[str, Any] = dict(case.params)
    row.update(case.options)
    if case.ff_impl is not None:
        row["ff_impl"] = case.ff_impl
        row.update({f"ff_{k}": v for k, v in case.ff_options})
    row.update(causal=case.causal, activation=case.activation, dtype=case.dtype)
    if case.protocol != DEFAULT_PROTOCOL:
        row["protocol"] = case.protocol
    return row


def context(measurement: Measurement, budget: Budget | None) -> dict[str, Any]:
    """The context columns: the machine's load around the measurement, the samples' spread, the trust flag
    (:func:`topk_bench.results.trust.flags`), and the budget the case ran under (what resume compares)."""
    m, meta, budget = measurement, measurement.metadata or {}, budget or Budget()
    machine = {key: meta.get(key) for key in ("load_start", "load_end", "steal")}
    spread = trust.cv(m.times_s)
    return {
        "trust": trust.flags(**machine, time_cv=spread) if m.times_s else "",
        "time_cv": spread, **machine,
        "max_memory_bytes": budget.max_memory_bytes, "max_case_seconds": budget.max_seconds,
    }


def make_row(case: Case, measurement: Measurement, defaults: Mapping[str, str] | None = None,
             traffic: rates.Traffic | None = None, budget: Budget | None = None) -> dict[str, Any]:
    """One CSV row. ``defaults`` fills torch_version/git_sha/device_name a measurement lacks (skipped rows);
    ``traffic``, what the case's workload says one iteration does, gives the rate columns; ``budget``: the one
    the case ran under."""
    m, meta, defaults = measurement, measurement.metadata or {}, defaults or {}
    row: dict[str, Any] = {
        "suite": case.suite, "case_id": case.case_id, "workload": case.workload, "impl": case.impl,
        "label": case.label, "mode": case.mode, "device": case.device,
        "device_name": m.device_name or meta.get("device_name") or defaults.get("device_name", ""),
        "method": case.method, "status": str(m.status),
        "error": " ".join(str(m.error).split())[:1000],  # one line: the CSV stays readable with grep
        "peak_bytes": m.peak_bytes, "reserved_bytes": m.reserved_bytes, "baseline_bytes": m.baseline_bytes,
        "time_median_s": m.time_median_s, "time_iqr_s": m.time_iqr_s, "time_mean_s": m.time_mean_s,
        "time_min_s": m.time_min_s, "repeats": len(m.times_s),
        "times_s": ";".join(repr(float(t)) for t in m.times_s), "flops": m.flops,
        "torch_version": meta.get("torch_version") or defaults.get("torch_version", ""),
        "git_sha": meta.get("git_sha") or defaults.get("git_sha", ""),
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    row.update(parameters(case))
    row.update(rates.columns(traffic, m))
    row.update(m.extra or {})
    row.update(context(m, budget))
    return row
