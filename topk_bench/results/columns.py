"""The vocabulary of the results CSV: required columns, result (optional) columns, context columns, metrics,
column order.

One place for every column name the harness writes or reads (docs/CONTRACTS.md,
"Results CSV"). A header is: the required columns in their order, then one
column per suite parameter, then the optional result columns a suite asks for,
then the context columns (how far to trust the time, the budget the case ran
under). Context columns are written with every row but not required: a CSV from
before them still loads (readers see them empty).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from topk_bench.units import GIB

REQUIRED_COLUMNS = (
    "suite", "case_id", "workload", "impl", "label", "mode", "device", "device_name", "method",
    "status", "error", "peak_bytes", "reserved_bytes", "baseline_bytes", "time_median_s",
    "time_iqr_s", "time_mean_s", "time_min_s", "repeats", "times_s", "flops", "torch_version",
    "git_sha", "timestamp",
)
# Columns of text: never turned into numbers by a reader (a case_id can be all digits).
TEXT_COLUMNS = ("suite", "case_id", "workload", "impl", "label", "mode", "device", "device_name",
                "method", "status", "error", "times_s", "torch_version", "git_sha", "timestamp", "trust")
# Written with every row since issue 19, not required of a file (older CSVs lack them); readers fill them empty.
CONTEXT_COLUMNS = ("trust", "time_cv", "load_start", "load_end", "steal", "max_memory_bytes", "max_case_seconds")
_CONTEXT: dict[str, str] = {
    "trust": "busy, noisy, busy;noisy or empty (topk_bench.results.trust)",
    "time_cv": "coefficient of variation of times_s (standard deviation / mean)",
    "load_start": "1-minute load average per core when the measurement started",
    "load_end": "1-minute load average per core when it ended",
    "steal": "share of the CPU time stolen by a hypervisor while it ran (Linux /proc/stat)",
    "max_memory_bytes": "the memory budget the case ran under",
    "max_case_seconds": "the time budget the case ran under",
}
# Result columns beyond the required ones, filled when a suite or a workload asks for them.
FIDELITY_COLUMNS = ("rel_err", "grad_cos", "fidelity_seq_len")
# Selection quality against exact attention on the same inputs (``quality = [...]``), per input kind:
# the case's own random inputs, and the pretrained MiniLM's activations (prefix "minilm_").
QUALITY_KINDS = ("random", "minilm")
QUALITY_METRICS = ("topk_recall", "mass_recall", "rel_err", "attended_fraction")


def quality_columns(kind: str) -> tuple[str, ...]:
    """The columns of one input kind of ``quality``: ``topk_recall``... (random), ``minilm_topk_recall``..."""
    prefix = "" if kind == "random" else f"{kind}_"
    return tuple(prefix + name for name in QUALITY_METRICS)


# Measured on CUDA: what the warm-up left allocated besides parameters and inputs (cuBLAS workspaces),
# live through the timed iterations; peak_bytes - workspace_bytes compares with the CPU and predict.
WORKSPACE_COLUMN = "workspace_bytes"
# An implementation that compiles on its first call (flex): that call's seconds, outside the timed region.
COMPILE_COLUMN = "compile_s"
_OPTIONAL: dict[str, str] = {
    COMPILE_COLUMN: "seconds of the first (warm-up) call of an implementation that compiles (flex), compilation included",
    WORKSPACE_COLUMN: "what the first iterations left allocated besides parameters and inputs (CUDA: cuBLAS workspaces)",
    "rel_err": ("relative Frobenius error of the output against exact attention: vanilla's layer (fidelity), "
                "float64 softmax attention on the same q, k, v (quality)"),
    "topk_recall": "share of the exact top-k keys by score a query attends, k = the keys it attends (random inputs)",
    "mass_recall": "exact softmax probability mass on the keys a query attends (random inputs)",
    "attended_fraction": "mean share of its allowed keys a query attends (random inputs)",
    "minilm_topk_recall": "topk_recall on the pretrained MiniLM's q, k, v over the shipped corpus",
    "minilm_mass_recall": "mass_recall on the pretrained MiniLM's q, k, v over the shipped corpus",
    "minilm_rel_err": "rel_err against float64 exact attention on the pretrained MiniLM's q, k, v",
    "minilm_attended_fraction": "attended_fraction on the pretrained MiniLM's q, k, v",
    "grad_cos": "cosine of the input gradients against vanilla's",
    "fidelity_seq_len": "the seq_len at which rel_err and grad_cos were measured",
    # The pretrained workload: sentence embeddings against the original model's.
    "emb_cos": "mean cosine of each text's embedding with the original model's",
    "nn_agree": "share of texts whose nearest neighbour is unchanged",
    "nn_spearman": "mean rank correlation of each text's similarities to all others",
    # Workloads with a cost model (prefill, decode): its quantities per iteration, then rates by the
    # median time (topk_bench.results.rates; the models are stated in docs/CONTRACTS.md).
    "kv_cache_bytes": "bytes of the KV cache's cached tokens (K and V), an input built before the measured region",
    "model_flops": "FLOPs of one iteration by the workload's cost model (dense attention over the attended pairs)",
    "bytes_moved": "bytes one iteration reads and writes by the workload's cost model",
    "tokens": "tokens one iteration produces, all sequences of the batch",
    "flops_per_s": "achieved FLOP/s: model_flops / time_median_s",
    "bytes_per_s": "achieved bandwidth: bytes_moved / time_median_s",
    "tokens_per_s": "tokens / time_median_s",
    "time_per_token_s": "time_median_s per token of one sequence (decode: per new token)",
}


# What a reader accepts in a cell (an empty cell is always "not measured"): measurements are
# finite numbers >= 0, result columns finite numbers; times_s holds ';'-separated measurements.
MEASUREMENT_COLUMNS = ("peak_bytes", "reserved_bytes", "baseline_bytes", "time_median_s", "time_iqr_s",
                       "time_mean_s", "time_min_s", "repeats", "flops", WORKSPACE_COLUMN,
                       "time_cv", "load_start", "load_end", "steal", "max_memory_bytes", "max_case_seconds")
_FINITE = set(_OPTIONAL)  # every known result column is a number; a plug-in's own column need not be


def register_column(name: str, description: str, *, number: bool = False) -> None:
    """Declare a result column (a workload's own, e.g. the pretrained model's ``emb_cos``); ``number``: readers
    leave out a row whose value is not a finite number."""
    if name in REQUIRED_COLUMNS or name in _CONTEXT:
        raise ValueError(f"{name!r} is a column of every row")
    _OPTIONAL.setdefault(name, description)
    if number:
        _FINITE.add(name)


def _numbers_problem(values: list[str], non_negative: bool) -> str | None:
    low = 0.0 if non_negative else -math.inf
    try:  # the common case first, fast (every row is checked): all fine; NaN fails every comparison
        if len(values) == 1:
            if low <= float(values[0]) < math.inf:
                return None
        elif all(low <= float(v) < math.inf for v in values):
            return None
    except ValueError:
        pass
    for value in values:  # say which, and why
        try:
            number = float(value)
        except ValueError:
            return f"expected a number, got {value!r}"
        if not math.isfinite(number):
            return f"not finite: {value!r}"
        if number < low:
            return f"negative: {value!r}"
    return None


def holds_numbers(column: str) -> bool:
    """Whether :func:`cell_problem` checks the column's cells (the others hold any text)."""
    return column == "times_s" or column in MEASUREMENT_COLUMNS or column in _FINITE


def cell_problem(column: str, value: str) -> str | None:
    """Why ``value`` cannot be a cell of ``column`` (None: it can). Parameter and text columns hold anything."""
    if value == "" or not holds_numbers(column):
        return None
    if column == "times_s":
        problem = _numbers_problem(value.split(";"), non_negative=True)
    else:
        problem = _numbers_problem([value], non_negative=column in MEASUREMENT_COLUMNS)
    return f"{column}: {problem}" if problem else None


def optional_columns() -> tuple[str, ...]:
    return tuple(_OPTIONAL)


def is_parameter(column: str) -> bool:
    """Neither a required, a context nor a known result column: a suite parameter (shape, option, masking, dtype)."""
    return column not in REQUIRED_COLUMNS and column not in _CONTEXT and column not in _OPTIONAL


def parameter_columns(columns: Iterable[str]) -> list[str]:
    return [c for c in columns if is_parameter(c)]


# Parameter columns first and last in a header; implementation options in between.
_PARAMETERS_FIRST = ("model", "seq_len", "kv_len", "new_tokens", "budget", "batch", "q_heads", "kv_heads", "head_dim",
                     "d_model", "heads", "d_ff", "layers")
_PARAMETERS_LAST = ("causal", "activation", "dtype", "protocol")


def order_parameters(names: Iterable[str]) -> list[str]:
    """Shape parameters first, then options, then masking, activation, dtype and protocol; otherwise first-seen order."""
    names = list(dict.fromkeys(names))
    middle = [c for c in names if c not in _PARAMETERS_FIRST and c not in _PARAMETERS_LAST]
    return ([c for c in _PARAMETERS_FIRST if c in names] + middle
            + [c for c in _PARAMETERS_LAST if c in names])


def header(parameters: Iterable[str], optional: Iterable[str] = ()) -> list[str]:
    """A suite's CSV header: required, then parameters, then optional result columns, then context columns."""
    out = list(REQUIRED_COLUMNS)
    for name in [*parameters, *optional, *CONTEXT_COLUMNS]:
        if name not in out:
            out.append(name)
    return out


@dataclass(frozen=True)
class Metric:
    """A quantity a figure or a table shows: its column (less the ``minus`` column), the factor to its unit, its label."""

    name: str
    column: str
    scale: float
    label: str
    unit: str = ""
    minus: str | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns it is computed from."""
        return (self.column,) + ((self.minus,) if self.minus else ())


METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("memory", "peak_bytes", 1 / GIB, "peak allocated memory (GiB)", "GiB"),
    Metric("reserved", "reserved_bytes", 1 / GIB, "peak reserved memory (GiB)", "GiB"),
    Metric("time", "time_median_s", 1.0, "time (s)", "s"),
    # The peak above what was live before the measured region: the step's own memory, cache excluded.
    Metric("working_memory", "peak_bytes", 1 / GIB, "peak above inputs (GiB)", "GiB", minus="baseline_bytes"),
    Metric("kv_cache", "kv_cache_bytes", 1 / GIB, "KV cache (GiB)", "GiB"),
    Metric("time_per_token", "time_per_token_s", 1e3, "time per token (ms)", "ms"),
    Metric("tokens_per_s", "tokens_per_s", 1.0, "tokens / s"),
    Metric("flops_per_s", "flops_per_s", 1e-12, "achieved TFLOP/s", "TFLOP/s"),
    Metric("bandwidth", "bytes_per_s", 1e-9, "achieved bandwidth (GB/s)", "GB/s"),
    Metric("time_mean", "time_mean_s", 1.0, "time, mean (s)", "s"),  # the paper's statistic
    Metric("flops", "flops", 1e-12, "TFLOP", "TFLOP"),
    Metric("rel_err", "rel_err", 1.0, "relative error vs exact"),
    Metric("topk_recall", "topk_recall", 1.0, "top-k recall (random)"),
    Metric("mass_recall", "mass_recall", 1.0, "mass recall (random)"),
    Metric("attended_fraction", "attended_fraction", 1.0, "share of keys attended"),
    Metric("minilm_topk_recall", "minilm_topk_recall", 1.0, "top-k recall (MiniLM)"),
    Metric("minilm_mass_recall", "minilm_mass_recall", 1.0, "mass recall (MiniLM)"),
    Metric("minilm_rel_err", "minilm_rel_err", 1.0, "relative error vs exact (MiniLM)"),
    Metric("grad_cos", "grad_cos", 1.0, "gradient cosine vs vanilla"),
    Metric("emb_cos", "emb_cos", 1.0, "embedding cosine vs vanilla"),
    Metric("nn_agree", "nn_agree", 1.0, "top-1 neighbour agreement"),
    Metric("nn_spearman", "nn_spearman", 1.0, "neighbour rank correlation"),
)}


def register_metric(metric: Metric, description: str = "") -> None:
    """A metric of a workload's own column (registers the column as a result column too)."""
    METRICS[metric.name] = metric
    if metric.column not in REQUIRED_COLUMNS:
        register_column(metric.column, description or metric.label, number=True)


def metric(name: str) -> Metric:
    """A named metric, or any CSV column shown as is (for plug-in suites)."""
    return METRICS.get(name) or Metric(name, name, 1.0, name)
