"""The rate columns of a row: what a case's workload says one iteration does (its ``Traffic``: FLOPs and bytes
by the workload's stated cost model, tokens), divided by the measured median time.

The one place these are derived (docs/CONTRACTS.md, "Results CSV"). A case whose
workload states no traffic gets none of these columns; one without a time (predicted,
failed) gets the traffic's own columns and empty rates.
"""

from __future__ import annotations

from typing import Any, Protocol

from topk_bench.case import Measurement
from topk_bench.results import columns as col

# The workload's own quantities (per iteration), then the rates derived from the median time.
TRAFFIC_COLUMNS = (col.KV_CACHE_BYTES, col.MODEL_FLOPS, col.BYTES_MOVED, col.TOKENS)
RATE_COLUMNS = (col.FLOPS_PER_S, col.BYTES_PER_S, col.TOKENS_PER_S, col.TIME_PER_TOKEN_S)
COLUMNS = TRAFFIC_COLUMNS + RATE_COLUMNS


class Traffic(Protocol):  # topk_bench.workloads.Traffic (results does not import the workloads)
    # Read-only, as the frozen dataclass's fields are.
    @property
    def flops(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def tokens(self) -> int: ...
    @property
    def tokens_per_sequence(self) -> int: ...
    @property
    def kv_cache_bytes(self) -> int | None: ...


def names(traffic: Traffic | None) -> tuple[str, ...]:
    """The columns a case with this traffic fills (``kv_cache_bytes`` only where there is a cache)."""
    if traffic is None:
        return ()
    return tuple(c for c in COLUMNS if c != col.KV_CACHE_BYTES or traffic.kv_cache_bytes is not None)


def columns(traffic: Traffic | None, measurement: Measurement) -> dict[str, Any]:
    """The traffic and rate columns of one row; empty when the workload states no traffic."""
    if traffic is None:
        return {}
    time = measurement.time_median_s
    rate = (lambda amount: amount / time) if time else (lambda amount: None)
    values: dict[str, Any] = {
        col.KV_CACHE_BYTES: traffic.kv_cache_bytes,
        col.MODEL_FLOPS: traffic.flops,
        col.BYTES_MOVED: traffic.bytes,
        col.TOKENS: traffic.tokens,
        col.FLOPS_PER_S: rate(traffic.flops),
        col.BYTES_PER_S: rate(traffic.bytes),
        col.TOKENS_PER_S: rate(traffic.tokens),
        col.TIME_PER_TOKEN_S: time / traffic.tokens_per_sequence if time else None,
    }
    return {name: values[name] for name in names(traffic)}
