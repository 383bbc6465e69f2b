"""The vocabulary of the results CSV: every column as an object, the metrics figures draw, column order.

One place for every column name the harness writes or reads (docs/CONTRACTS.md,
"Results CSV"); code refers to a column by its attribute here (``col.PEAK_BYTES``),
never by its spelling. A :class:`Column` *is* its name (a ``str``: a dict key, a
pandas column), and knows what it means and what its cells may hold. A header is:
the required columns in their order, then one column per suite parameter, then the
optional result columns a suite asks for, then the context columns (how far to trust
the time, the budget the case ran under). Context columns are written with every row
but not required: a CSV without them still loads (readers see them empty).

One name per meaning: the selection quality's relative error against exact attention is
``attn_rel_err`` (``rel_err`` is fidelity's, against vanilla's layer). A CSV whose quality
columns carry fidelity's names is read with them renamed (:func:`migrate`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum

from topk_bench.units import GIB


class Cells(Enum):
    """What a column's cells may hold (an empty cell is always "not measured")."""

    TEXT = "text"  # anything; never turned into a number by a reader (a case_id can be all digits)
    MEASUREMENT = "measurement"  # a finite number >= 0
    SAMPLES = "samples"  # ';'-separated finite numbers >= 0 (times_s)
    NUMBER = "number"  # a finite number (a result column)
    ANY = "any"  # a plug-in's own column: not checked


class Column(str):
    """A CSV column: its name (the string itself), what it means, and what its cells may hold."""

    description: str
    cells: Cells

    def __new__(cls, name: str, description: str = "", cells: Cells = Cells.ANY) -> Column:
        column = super().__new__(cls, name)
        column.description, column.cells = description, cells
        return column

    def __getnewargs__(self) -> tuple:
        return str(self), self.description, self.cells

    @property
    def name(self) -> str:
        return str(self)


T, M, N = Cells.TEXT, Cells.MEASUREMENT, Cells.NUMBER

# -- required: every row, in this order ------------------------------------------------------------
SUITE = Column("suite", "the suite's name", T)
CASE_ID = Column("case_id", "a stable hash of what determines the result", T)
WORKLOAD = Column("workload", "what ran: the workload", T)
IMPL = Column("impl", "the attention implementation (registry name)", T)
LABEL = Column("label", "the legend; empty: the implementation's name (legend())", T)
MODE = Column("mode", "fwd or fwd_bwd", T)
DEVICE = Column("device", "cpu or cuda", T)
DEVICE_NAME = Column("device_name", "the CPU or GPU model", T)
METHOD = Column("method", "measured or predicted", T)
STATUS = Column("status", "ok, or why not (topk_bench.status)", T)
ERROR = Column("error", "one line of why", T)
PEAK_BYTES = Column("peak_bytes", "peak of live tensors during the measured iterations, inputs included", M)
RESERVED_BYTES = Column("reserved_bytes", "CUDA: max_memory_reserved of the timed iterations", M)
BASELINE_BYTES = Column("baseline_bytes", "what exists before the first iteration: parameters and inputs", M)
TIME_MEDIAN_S = Column("time_median_s", "median seconds per iteration", M)
TIME_IQR_S = Column("time_iqr_s", "interquartile range of the samples", M)
TIME_MEAN_S = Column("time_mean_s", "mean seconds per iteration", M)
TIME_MIN_S = Column("time_min_s", "fastest sample", M)
REPEATS = Column("repeats", "how many timed samples", M)
TIMES_S = Column("times_s", "the samples, ';'-separated", Cells.SAMPLES)
FLOPS = Column("flops", "FLOPs of one iteration (torch.utils.flop_counter)", M)
TORCH_VERSION = Column("torch_version", "provenance", T)
GIT_SHA = Column("git_sha", "provenance (-dirty for a modified checkout)", T)
TIMESTAMP = Column("timestamp", "when the row was written (UTC)", T)
REQUIRED_COLUMNS: tuple[Column, ...] = (
    SUITE,
    CASE_ID,
    WORKLOAD,
    IMPL,
    LABEL,
    MODE,
    DEVICE,
    DEVICE_NAME,
    METHOD,
    STATUS,
    ERROR,
    PEAK_BYTES,
    RESERVED_BYTES,
    BASELINE_BYTES,
    TIME_MEDIAN_S,
    TIME_IQR_S,
    TIME_MEAN_S,
    TIME_MIN_S,
    REPEATS,
    TIMES_S,
    FLOPS,
    TORCH_VERSION,
    GIT_SHA,
    TIMESTAMP,
)

# -- context: written with every row, not required of a file ---------------------------------------
TRUST = Column("trust", "busy, contended, noisy, ';'-joined, or empty (topk_bench.results.trust)", T)
TIME_CV = Column("time_cv", "coefficient of variation of times_s (standard deviation / mean)", M)
# How many interleaved rounds times_s pools, round after round (compare --relative-to divides round by round).
ROUNDS = Column("rounds", "interleaved rounds whose samples times_s holds, round after round, the same number each", M)
LOAD_START = Column("load_start", "1-minute load average per core when the measurement started", M)
LOAD_END = Column("load_end", "1-minute load average per core when it ended", M)
STEAL = Column("steal", "share of the CPU time stolen by a hypervisor while it ran (Linux /proc/stat)", M)
MAX_MEMORY_BYTES = Column("max_memory_bytes", "the memory budget the case ran under", M)
MAX_CASE_SECONDS = Column("max_case_seconds", "the time budget the case ran under", M)
# What running the case cost, start-up included: the next run of the same case on this machine is estimated by it.
WALL_S = Column("wall_s", "seconds the case's child process took, from its start to its result (the parent's clock)", M)
# What the case's threads got of the machine during its timed iterations (topk_bench.measure.contention).
THREADS = Column("threads", "the intra-op CPU threads the case ran with", M)
CPU_WAIT = Column(
    "cpu_wait",
    "median over timed iterations of the largest share of the iteration one of the case's "
    "threads was runnable but waited for a CPU (Linux schedstat run delay)",
    M,
)
CPU_SHARE = Column("cpu_share", "median over timed iterations of the process's CPU time over threads x wall time", M)
PREEMPT_PER_S = Column("preempt_per_s", "involuntary context switches of the process per second of timed iterations", M)
RUNNABLE = Column(
    "runnable",
    "the machine's runnable threads per core (the case's own included), median of the "
    "samples taken after each timed iteration",
    M,
)
CONTENTION_COLUMNS: tuple[Column, ...] = (THREADS, CPU_WAIT, CPU_SHARE, PREEMPT_PER_S, RUNNABLE)
# How the time was taken: measured rows only.
TIMER = Column("timer", "perf_counter or process_time (CPU), events or cudagraph (CUDA): what timed each sample", T)
FLUSH_L2 = Column("flush_l2", "True when the device's cache was flushed before each timed iteration", T)
# What the child measured with, as it found it (not what the case asked: a difference makes the row not_as_asked).
GRAPH_REPLAYS = Column("graph_replays", "how many of the timed samples were replays of a captured CUDA graph", M)
LOOPS = Column(
    "loops", "timed iterations in each sample (min_sample_s): each of times_s is their mean, seconds per iteration", M
)
RAN_DTYPE = Column("ran_dtype", "the dtype the built workload ran in (its floating-point inputs')", T)
COMPILED = Column(
    "compiled",
    "compile = true: True when torch.compile made a graph of the attention in its first call, False when it ran "
    "eagerly; empty for an eager case",
    T,
)
# What an iteration dispatched (every backend: cpu, cuda, predict).
OPS_PER_ITER = Column(
    "ops_per_iter",
    "aten ops one iteration dispatches (measure/ops.py): with a few µs of host "
    "time each, what makes a method dispatch-bound",
    M,
)
KERNEL_LAUNCHES = Column(
    "kernel_launches",
    "CUDA (measured or predicted): the ops of ops_per_iter that launch a kernel (not views, not allocations): "
    "an eager iteration's host cost is launches x the cost of one",
    M,
)
SDPA_BACKEND = Column(
    "sdpa_backend",
    "the backend SDPA ran (flash_attention, efficient_attention, cudnn_attention, "
    "math, overrideable), from the op it dispatched; empty: no SDPA call",
    T,
)
# The machine and its software beyond device_name and torch_version (compare warns when they differ).
CPU_CAPABILITY = Column("cpu_capability", "the instruction set ATen's CPU kernels use (AVX2, AVX512...)", T)
CPU_FLAGS = Column("cpu_flags", "bf16/AMX flags of the CPU (/proc/cpuinfo), ';'-separated, or none", T)
CUDA_VERSION = Column("cuda_version", "the CUDA torch was built with (torch.version.cuda)", T)
CUDNN_VERSION = Column("cudnn_version", "cuDNN's version (measured on CUDA)", T)
DRIVER_VERSION = Column("driver_version", "the NVIDIA driver (measured on CUDA)", T)
GPU_SM_CLOCK_MHZ = Column("gpu_sm_clock_mhz", "the GPU's SM clock when the measurement ended (MHz)", M)
GPU_SM_CLOCK_MAX_MHZ = Column("gpu_sm_clock_max_mhz", "the GPU's maximum SM clock (MHz)", M)
MACHINE_COLUMNS: tuple[Column, ...] = (
    CPU_CAPABILITY,
    CPU_FLAGS,
    CUDA_VERSION,
    CUDNN_VERSION,
    DRIVER_VERSION,
    GPU_SM_CLOCK_MHZ,
    GPU_SM_CLOCK_MAX_MHZ,
)
# Which suite wrote the row besides its name: two suites of one name are two suites (topk_bench.suite.schema).
SUITE_FINGERPRINT = Column(
    "suite_fingerprint", "a hash of what makes the suite's cases (Suite.fingerprint): which suite of that name", T
)
# Which code ran, where the machine decides it (topk_bench.attention.provenance): compare warns when it differs.
CODE_PATH = Column(
    "code_path",
    "the machine-dependent code the case's implementation ran: native_kernels (built:<build key>, or torch:<why "
    "not>), half_products (native or float32_copies), decode_tiles (bytes of a decode step's key tiles), "
    "triton_kernels (triton:<version>, or torch:<why not>), cuda_torch (batched or bags: the torch path on CUDA), as "
    "';'-joined key=value (a feed-forward implementation's prefixed ff.); empty: none applies",
    T,
)
CONTEXT_COLUMNS: tuple[Column, ...] = (
    SUITE_FINGERPRINT,
    TRUST,
    TIME_CV,
    ROUNDS,
    LOAD_START,
    LOAD_END,
    STEAL,
    MAX_MEMORY_BYTES,
    MAX_CASE_SECONDS,
    WALL_S,
    *CONTENTION_COLUMNS,
    TIMER,
    GRAPH_REPLAYS,
    LOOPS,
    FLUSH_L2,
    RAN_DTYPE,
    COMPILED,
    OPS_PER_ITER,
    SDPA_BACKEND,
    CODE_PATH,
    *MACHINE_COLUMNS,
)

# -- optional result columns, filled when a suite or a workload asks for them ----------------------
COMPILE_S = Column(
    "compile_s",
    "seconds of the first (warm-up) call of a case that compiles (flex, compile = true), compilation included",
    N,
)
WORKSPACE_BYTES = Column(
    "workspace_bytes",
    "what the first iterations left allocated besides parameters and inputs "
    "(CUDA: cuBLAS workspaces); peak_bytes - workspace_bytes compares with the CPU and --predict; "
    "--predict --device cuda predicts it (the workspaces at their first use)",
    M,
)
TIME_PREDICTED_S = Column(
    "time_predicted_s",
    "--predict --device cuda: predicted seconds of one eager iteration on the modelled GPU, the larger of "
    "device_time_predicted_s and the host's launches x launch cost (topk_bench.predict.timing)",
    M,
)
DEVICE_TIME_PREDICTED_S = Column(
    "device_time_predicted_s",
    "--predict --device cuda: predicted seconds of the iteration's kernels one after another (a CUDA graph's "
    "replay, timer cudagraph)",
    M,
)
HOST_BOUND = Column(
    "host_bound",
    "--predict --device cuda: True when the host's launches take longer than the kernels (the eager time is "
    "the host's)",
    T,
)
PREDICTED_TIME_COLUMNS: tuple[Column, ...] = (TIME_PREDICTED_S, DEVICE_TIME_PREDICTED_S, HOST_BOUND)
CUDA_UNMODELED_OPS = Column(
    "cuda_unmodeled_ops",
    "--predict --device cuda: the aten ops of the case whose CUDA "
    "kernels may allocate otherwise than predicted (no allocation rule, or one that leaves "
    "some buffer out: topk_bench.predict.kernels), ';'-separated; empty: all modelled",
    T,
)
# Fidelity (fidelity = true): the layer against vanilla's, same inputs and weights.
REL_ERR = Column("rel_err", "relative Frobenius error of the layer's output against vanilla's layer (fidelity)", N)
GRAD_COS = Column("grad_cos", "cosine of the input gradients against vanilla's", N)
FIDELITY_SEQ_LEN = Column("fidelity_seq_len", "the seq_len at which rel_err and grad_cos were measured", N)
FIDELITY_COLUMNS: tuple[Column, ...] = (REL_ERR, GRAD_COS, FIDELITY_SEQ_LEN)
# Selection quality against exact attention on the same inputs (quality = [...]), per input kind: the
# case's own random inputs, the pretrained MiniLM's activations (prefix "minilm_") and synthetic peaked
# inputs with an LLM head's sinks, locality and heavy hitters (prefix "peaked_"; topk_bench/extras/peaked.py).
QUALITY_KINDS = ("random", "minilm", "peaked")
QUALITY_METRICS: dict[str, str] = {
    "topk_recall": "share of the exact top-k keys by score a query attends, k = the keys it attends",
    "mass_recall": "exact softmax probability mass on the keys a query attends",
    "attn_rel_err": "relative Frobenius error of the attention output against float64 exact attention",
    "attended_fraction": "mean share of its allowed keys a query attends",
}
_ON = {
    "random": "random inputs",
    "minilm": "the pretrained MiniLM's q, k, v over the shipped corpus",
    "peaked": "synthetic peaked inputs: sinks, locality, heavy hitters",
}
QUALITY: dict[str, dict[str, Column]] = {
    kind: {
        metric: Column(("" if kind == "random" else f"{kind}_") + metric, f"{what} ({_ON[kind]})", N)
        for metric, what in QUALITY_METRICS.items()
    }
    for kind in QUALITY_KINDS
}
TOPK_RECALL, MASS_RECALL, ATTN_REL_ERR, ATTENDED_FRACTION = QUALITY["random"].values()
# The pretrained workload: sentence embeddings against the original model's.
EMB_COS = Column("emb_cos", "mean cosine of each text's embedding with the original model's", N)
NN_AGREE = Column("nn_agree", "share of texts whose nearest neighbour is unchanged", N)
NN_SPEARMAN = Column("nn_spearman", "mean rank correlation of each text's similarities to all others", N)
# Workloads with a cost model (prefill, decode): its quantities per iteration, then rates by the median time
# (topk_bench.results.rates; the models are stated in docs/CONTRACTS.md).
KV_CACHE_BYTES = Column(
    "kv_cache_bytes",
    "bytes of the KV cache's cached tokens (K and V) and what the "
    "implementation keeps with it, built before the measured region",
    N,
)
MODEL_FLOPS = Column(
    "model_flops", "FLOPs of one iteration by the workload's cost model (dense attention over the attended pairs)", N
)
BYTES_MOVED = Column("bytes_moved", "bytes one iteration reads and writes by the workload's cost model", N)
TOKENS = Column("tokens", "tokens one iteration produces, all sequences of the batch", N)
FLOPS_PER_S = Column("flops_per_s", "achieved FLOP/s: model_flops / time_median_s", N)
BYTES_PER_S = Column("bytes_per_s", "achieved bandwidth: bytes_moved / time_median_s", N)
TOKENS_PER_S = Column("tokens_per_s", "tokens / time_median_s", N)
TIME_PER_TOKEN_S = Column("time_per_token_s", "time_median_s per token of one sequence (decode: per new token)", N)

# The physical limit of the row's own work on its device's peaks (FLOPs and bytes at peak rates), and the share
# of the time it is: known to the readers so that they are results, not parameters, whoever writes them.
ROOFLINE_S = Column("roofline_s", "seconds the row's work takes at the device's peak FLOP/s and bandwidth", M)
ROOFLINE_FRAC = Column("roofline_frac", "roofline_s over the row's time: 1 is the physical limit", M)

# Per-stage cost of implementations that mark stages (topk_bench.attention.shared.stages): JSON objects keyed
# "forward.<stage>" / "backward.<stage>" (topk_bench.measure.stages).
STAGE_TIMES_S = Column(
    "stage_times_s",
    'seconds in each marked stage of one (extra, untimed) iteration, as JSON {"forward.<stage>": s, ...}',
    T,
)
STAGE_PEAK_BYTES = Column(
    "stage_peak_bytes",
    'highest live bytes inside each marked stage (baseline included, as peak_bytes), as JSON {"forward.<stage>": '
    "bytes, ...}",
    T,
)
STAGE_COLUMNS: tuple[Column, ...] = (STAGE_TIMES_S, STAGE_PEAK_BYTES)

_OPTIONAL: dict[str, Column] = {
    c: c
    for c in (
        COMPILE_S,
        WORKSPACE_BYTES,
        CUDA_UNMODELED_OPS,
        KERNEL_LAUNCHES,
        *PREDICTED_TIME_COLUMNS,
        *FIDELITY_COLUMNS,
        *(c for kind in QUALITY.values() for c in kind.values()),
        EMB_COS,
        NN_AGREE,
        NN_SPEARMAN,
        KV_CACHE_BYTES,
        MODEL_FLOPS,
        BYTES_MOVED,
        TOKENS,
        FLOPS_PER_S,
        BYTES_PER_S,
        TOKENS_PER_S,
        TIME_PER_TOKEN_S,
        ROOFLINE_S,
        ROOFLINE_FRAC,
        *STAGE_COLUMNS,
    )
}
_EVERY_ROW: dict[str, Column] = {c: c for c in (*REQUIRED_COLUMNS, *CONTEXT_COLUMNS)}
# Never turned into numbers by a reader (a case_id can be all digits; times_s is a list of them).
TEXT_COLUMNS: tuple[Column, ...] = tuple(c for c in _EVERY_ROW.values() if c.cells in (Cells.TEXT, Cells.SAMPLES))
MEASUREMENT_COLUMNS: tuple[Column, ...] = tuple(
    c for c in (*_EVERY_ROW.values(), *_OPTIONAL.values()) if c.cells is Cells.MEASUREMENT
)


def quality_columns(kind: str) -> tuple[Column, ...]:
    """The columns of one input kind of ``quality``: ``topk_recall``... (random), ``minilm_topk_recall``..."""
    return tuple(QUALITY[kind].values())


def column(name: str) -> Column:
    """The column of that name: a known one, or a parameter's or plug-in's (anything goes in its cells)."""
    return _EVERY_ROW.get(name) or _OPTIONAL.get(name) or Column(name)


def register_column(name: str, description: str, *, number: bool = False) -> Column:
    """Declare a result column (a workload's own); ``number``: readers leave out a row whose value is not a
    finite number."""
    if name in _EVERY_ROW:
        raise ValueError(f"{name!r} is a column of every row")
    known = _OPTIONAL.get(name)
    if known is None or (number and known.cells is not Cells.NUMBER):
        known = _OPTIONAL[name] = Column(
            name, known.description if known else description, Cells.NUMBER if number else Cells.ANY
        )
    return known


# -- migration: quality columns under fidelity's names ---------------------------------------------

# The selection quality's columns named as fidelity's (rel_err), renamed so that a name has one meaning; told
# apart from fidelity's by the other columns of the header (a suite asks for one of the two).
_QUALITY_RENAMED = {"rel_err": ATTN_REL_ERR, "minilm_rel_err": QUALITY["minilm"]["attn_rel_err"]}
_QUALITY_ONLY = {c for kind in QUALITY.values() for c in kind.values()} - set(_QUALITY_RENAMED.values())


def migrate(header: list[str]) -> list[str]:
    """``header`` with the quality columns under their own names (a quality ``rel_err`` is ``attn_rel_err``)."""
    if not any(c in _QUALITY_ONLY for c in header) or any(c in (GRAD_COS, FIDELITY_SEQ_LEN) for c in header):
        return list(header)
    return [_QUALITY_RENAMED.get(c, c) for c in header]


# -- what a reader accepts in a cell ---------------------------------------------------------------


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


def holds_numbers(name: str) -> bool:
    """Whether :func:`cell_problem` checks the column's cells (the others hold any text)."""
    return column(name).cells in (Cells.MEASUREMENT, Cells.SAMPLES, Cells.NUMBER)


def cell_problem(name: str, value: str) -> str | None:
    """Why ``value`` cannot be a cell of column ``name`` (None: it can). Parameter and text columns hold anything."""
    check = cell_checker(name)
    return check(value) if check is not None else None


def cell_checker(name: str) -> Callable[[str], str | None] | None:
    """:func:`cell_problem` of column ``name`` as a function of the cell (None: the column holds anything): the
    reader calls it on every numeric cell of a file, so the column is looked up once and a number that is fine
    costs one ``float``."""
    cells = column(name).cells
    if cells in (Cells.TEXT, Cells.ANY):
        return None
    low, samples = (0.0 if cells in (Cells.MEASUREMENT, Cells.SAMPLES) else -math.inf), cells is Cells.SAMPLES

    def check(value: str) -> str | None:
        if value == "":
            return None
        if not samples:
            try:
                if low <= float(value) < math.inf:  # NaN fails every comparison
                    return None
            except ValueError:
                pass
        problem = _numbers_problem(value.split(";") if samples else [value], non_negative=low == 0.0)
        return f"{name}: {problem}" if problem else None

    return check


def optional_columns() -> tuple[Column, ...]:
    return tuple(_OPTIONAL.values())


def is_parameter(name: str) -> bool:
    """Neither a required, a context nor a known result column: a suite parameter (shape, option, masking, dtype)."""
    return name not in _EVERY_ROW and name not in _OPTIONAL


def parameter_columns(columns: Iterable[str]) -> list[str]:
    return [c for c in columns if is_parameter(c)]


# Parameter columns first and last in a header; implementation options in between.
_PARAMETERS_FIRST = (
    "model",
    "seq_len",
    "kv_len",
    "new_tokens",
    "budget",
    "batch",
    "q_heads",
    "kv_heads",
    "head_dim",
    "d_model",
    "heads",
    "d_ff",
    "layers",
)
_PARAMETERS_LAST = ("causal", "activation", "dtype", "compile", "compile_mode", "protocol")


def order_parameters(names: Iterable[str]) -> list[str]:
    """Shape parameters first, then options, then masking, activation, dtype and protocol; otherwise first-seen
    order."""
    names = list(dict.fromkeys(names))
    middle = [c for c in names if c not in _PARAMETERS_FIRST and c not in _PARAMETERS_LAST]
    return [c for c in _PARAMETERS_FIRST if c in names] + middle + [c for c in _PARAMETERS_LAST if c in names]


def header(parameters: Iterable[str], optional: Iterable[str] = ()) -> list[str]:
    """A suite's CSV header: required, then parameters, then optional result columns, then context columns."""
    out: list[str] = list(REQUIRED_COLUMNS)
    for name in [*parameters, *optional, *CONTEXT_COLUMNS]:
        if name not in out:
            out.append(name)
    return out


def legend(label: object, impl: object) -> str:
    """What names a row in a legend or a table: its label, else its implementation (an empty label, a missing one)."""
    return label if isinstance(label, str) and label else str(impl)


def legends(rows) -> list[str]:
    """:func:`legend` of every row of a frame."""
    return [legend(label, impl) for label, impl in zip(rows[LABEL], rows[IMPL])]


# -- metrics: what a figure or a table shows -------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    """A quantity a figure or a table shows: its column (less the ``minus`` column), the factor to its unit, its
    label."""

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

    @property
    def timed(self) -> bool:
        """Read off the clock: a measurement under contention moves it (memory and quality it does not)."""
        return self.column in TIMED_COLUMNS


# The columns a measured time makes: the samples' statistics and the rates divided by them.
TIMED_COLUMNS = frozenset(
    {
        TIME_MEDIAN_S,
        TIME_IQR_S,
        TIME_MEAN_S,
        TIME_MIN_S,
        TIMES_S,
        FLOPS_PER_S,
        BYTES_PER_S,
        TOKENS_PER_S,
        TIME_PER_TOKEN_S,
    }
)


_MINILM = QUALITY["minilm"]
_PEAKED = QUALITY["peaked"]
METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("memory", PEAK_BYTES, 1 / GIB, "peak allocated memory (GiB)", "GiB"),
        Metric("reserved", RESERVED_BYTES, 1 / GIB, "peak reserved memory (GiB)", "GiB"),
        Metric("time", TIME_MEDIAN_S, 1.0, "time (s)", "s"),
        # What a CUDA prediction's figure draws for "time": the time model's eager iteration (predict/timing.py).
        Metric("time_predicted", TIME_PREDICTED_S, 1.0, "predicted time (s)", "s"),
        # The peak above what was live before the measured region: the step's own memory, cache excluded.
        Metric("working_memory", PEAK_BYTES, 1 / GIB, "peak above inputs (GiB)", "GiB", minus=BASELINE_BYTES),
        Metric("kv_cache", KV_CACHE_BYTES, 1 / GIB, "KV cache (GiB)", "GiB"),
        Metric("time_per_token", TIME_PER_TOKEN_S, 1e3, "time per token (ms)", "ms"),
        Metric("tokens_per_s", TOKENS_PER_S, 1.0, "tokens / s"),
        Metric("flops_per_s", FLOPS_PER_S, 1e-12, "achieved TFLOP/s", "TFLOP/s"),
        Metric("bandwidth", BYTES_PER_S, 1e-9, "achieved bandwidth (GB/s)", "GB/s"),
        Metric("time_mean", TIME_MEAN_S, 1.0, "time, mean (s)", "s"),  # the paper's statistic
        Metric("flops", FLOPS, 1e-12, "TFLOP", "TFLOP"),
        Metric("rel_err", REL_ERR, 1.0, "relative error vs vanilla"),
        Metric("grad_cos", GRAD_COS, 1.0, "gradient cosine vs vanilla"),
        Metric("topk_recall", TOPK_RECALL, 1.0, "top-k recall (random)"),
        Metric("mass_recall", MASS_RECALL, 1.0, "mass recall (random)"),
        Metric("attn_rel_err", ATTN_REL_ERR, 1.0, "relative error vs exact (random)"),
        Metric("attended_fraction", ATTENDED_FRACTION, 1.0, "share of keys attended"),
        Metric("minilm_topk_recall", _MINILM["topk_recall"], 1.0, "top-k recall (MiniLM)"),
        Metric("minilm_mass_recall", _MINILM["mass_recall"], 1.0, "mass recall (MiniLM)"),
        Metric("minilm_attn_rel_err", _MINILM["attn_rel_err"], 1.0, "relative error vs exact (MiniLM)"),
        Metric("peaked_topk_recall", _PEAKED["topk_recall"], 1.0, "top-k recall (peaked)"),
        Metric("peaked_mass_recall", _PEAKED["mass_recall"], 1.0, "mass recall (peaked)"),
        Metric("peaked_attn_rel_err", _PEAKED["attn_rel_err"], 1.0, "relative error vs exact (peaked)"),
        Metric("emb_cos", EMB_COS, 1.0, "embedding cosine vs vanilla"),
        Metric("nn_agree", NN_AGREE, 1.0, "top-1 neighbour agreement"),
        Metric("nn_spearman", NN_SPEARMAN, 1.0, "neighbour rank correlation"),
    )
}


def register_metric(metric: Metric, description: str = "") -> None:
    """A metric of a workload's own column (registers the column as a result column too)."""
    METRICS[metric.name] = metric
    if metric.column not in REQUIRED_COLUMNS:
        register_column(metric.column, description or metric.label, number=True)


def metric(name: str) -> Metric:
    """A named metric, or any CSV column shown as is (for plug-in suites)."""
    return METRICS.get(name) or Metric(name, name, 1.0, name)


def migrate_metrics(names: Iterable[str], columns: Iterable[str]) -> list[str]:
    """Metric names a suite wrote under fidelity's names, as :func:`migrate` renames them, for a CSV of
    ``columns``."""
    present = set(columns)
    renamed = {old: new for old, new in _QUALITY_RENAMED.items() if new in present and old not in present}
    return [renamed.get(n, n) for n in names]
