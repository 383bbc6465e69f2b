"""A case (what to measure: a frozen, hashable spec) and its measurement (what came out).

Modelled on torch.utils.benchmark's ``TaskSpec``/``Measurement``: the spec is
immutable and serialisable (it crosses a process boundary as JSON); the
measurement keeps the raw samples and derives its statistics from them.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from topk_bench.fields import coerce_fields
from topk_bench.protocol import DEFAULT as DEFAULT_PROTOCOL
from topk_bench.status import Status
from topk_bench.types import DEFAULT_GPU, DeviceKind, DType, GpuModel, Method, Mode, Timer


def _frozen(mapping: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((mapping or {}).items()))


@dataclass(frozen=True)
class Measuring:
    """How every case of a run is measured (or predicted): what the run's settings give each case it expands."""

    method: Method
    device: str  # "cpu" or "cuda": where cases run, or the device predicted for
    dtype: DType
    warmup: int
    warmup_s: float  # the warm-up lasts at least this long too (ours)
    min_sample_s: float  # each timed sample runs the iteration back to back until it lasts this long (ours)
    repeats: int
    timer: Timer | None  # measured on CUDA: events (None: the default) or cudagraph; None elsewhere
    flush_l2: bool  # the device's cache flushed between timed iterations (measured runs)
    threads: int  # intra-op CPU threads of each case (a prediction: 1)
    gpu: GpuModel | None  # a CUDA prediction: the GPU it models; None otherwise

    def case_fields(self) -> dict[str, Any]:
        """The :class:`Case` fields these settings give."""
        return {
            "method": self.method,
            "device": self.device,
            "dtype": self.dtype,
            "warmup": self.warmup,
            "warmup_s": self.warmup_s,
            "min_sample_s": self.min_sample_s,
            "repeats": self.repeats,
            "timer": self.timer,
            "flush_l2": self.flush_l2,
            "threads": self.threads,
            "gpu": self.gpu,
        }


@dataclass(frozen=True)
class Case:
    """One point of a sweep.

    ``params`` holds the shape parameters of the workload (``seq_len``,
    ``d_model``, ``heads``...: what its :class:`~topk_bench.workloads.WorkloadSpec`
    declares). ``options`` are the attention implementation's options; for a
    workload with a feed-forward sublayer (the decoder), ``ff_impl`` and
    ``ff_options`` choose the feed-forward implementation independently.
    """

    suite: str
    workload: str
    impl: str
    params: tuple[tuple[str, Any], ...]
    options: tuple[tuple[str, Any], ...] = ()
    ff_impl: str | None = None
    ff_options: tuple[tuple[str, Any], ...] = ()
    label: str = ""
    mode: Mode = Mode.FWD_BWD
    causal: bool = False
    activation: str = "softmax"
    dtype: DType = DType.FLOAT32
    device: str = "cpu"
    method: Method = Method.MEASURED
    seed: int = 0
    warmup: int = 1
    repeats: int = 3
    # Intra-op CPU threads the child runs with (None: torch's default); not in the case_id, as repeats.
    threads: int | None = None
    # Our protocol warms up until both: ``warmup`` untimed iterations (the profiling one included) and
    # ``warmup_s`` seconds of them (measure/iterations.py).
    warmup_s: float = 0.0
    # Each timed sample runs the iteration back to back until it lasts at least this long, its time their mean
    # (0: one iteration a sample); the count is fixed once, after the warm-up (measure/iterations.py).
    min_sample_s: float = 0.0
    # How a measured case is timed (None: the device's default, CUDA events, the CPU's perf_counter), and
    # whether the device's cache is flushed between timed iterations (outside the timing).
    timer: Timer | None = None
    flush_l2: bool = False
    # torch.compile the case's attention modules (``compile_mode``: torch.compile's ``mode``, None its default).
    compile: bool = False
    compile_mode: str | None = None
    # Modules the worker imports before measuring, so that user implementations
    # register themselves in the child process (e.g. "my_package.my_attention").
    plugins: tuple[str, ...] = ()
    # Also measure the error against vanilla (rel_err, grad_cos columns); suites opt in.
    fidelity: bool = False
    # How the case is built and measured (topk_bench.protocol): ours, or the paper's.
    protocol: str = DEFAULT_PROTOCOL
    # Also measure selection quality against exact attention on these inputs ("random", "minilm", "peaked");
    # suites opt in.
    quality: tuple[str, ...] = ()
    # The GPU a CUDA prediction models (run --predict --device cuda --gpu); None for any other case.
    gpu: GpuModel | None = None
    # The code path the parent found for the case's implementations here (run/plan.py, ``code_path`` of the
    # results); the child's own must be it, or the row is not_as_asked. Empty: none expected. Not in the case id.
    code_path: str = ""
    # Where the case's profile goes (topk_bench.profile: `topk-bench profile`, `run --profile`); empty: none.
    # Not in the case id: a profile changes what is written, not what is measured.
    profile: str = ""

    def __post_init__(self) -> None:
        # Spelled as in a suite or a JSON file, held as its annotations say: members (``case.timer is
        # Timer.CUDAGRAPH``), tuples. The one place for it, whichever field: topk_bench.fields.
        coerce_fields(self)

    @property
    def gpu_model(self) -> GpuModel:
        """The GPU a CUDA prediction of this case models (the default when none was named)."""
        return self.gpu or DEFAULT_GPU

    @classmethod
    def make(
        cls,
        *,
        params: Mapping[str, Any],
        options: Mapping[str, Any] | None = None,
        ff_options: Mapping[str, Any] | None = None,
        **fields: Any,
    ) -> Case:
        return cls(params=_frozen(params), options=_frozen(options), ff_options=_frozen(ff_options), **fields)

    @property
    def device_kind(self) -> DeviceKind:
        return DeviceKind.of(self.device)

    @property
    def predicted(self) -> bool:
        return self.method is Method.PREDICTED

    def measured_on(self, kind: DeviceKind) -> bool:
        """Run and measured on a device of ``kind`` (not predicted for it)."""
        return self.method is Method.MEASURED and self.device_kind is kind

    @property
    def param_dict(self) -> dict[str, Any]:
        return dict(self.params)

    @property
    def option_dict(self) -> dict[str, Any]:
        return dict(self.options)

    @property
    def ff_option_dict(self) -> dict[str, Any]:
        return dict(self.ff_options)

    @property
    def case_id(self) -> str:
        """Stable hash of what determines the result: parameters, implementation(s), device, method, protocol,
        and, only when set, fidelity, quality, a CUDA-graph timer, the cache flush, compilation.

        Not the label, warm-up, repeat count or threads: re-running with more repeats resumes.
        """
        key: dict[str, Any] = {
            "suite": self.suite,
            "workload": self.workload,
            "impl": self.impl,
            "params": self.params,
            "options": self.options,
            "ff_impl": self.ff_impl,
            "ff_options": self.ff_options,
            "mode": self.mode,
            "causal": self.causal,
            "activation": self.activation,
            "dtype": self.dtype,
            "device": self.device,
            "method": self.method,
            "seed": self.seed,
        }
        # The keys below only when set, so that adding one leaves the ids of the cases without it unchanged.
        if self.fidelity:
            key["fidelity"] = True
        if self.protocol != DEFAULT_PROTOCOL:
            key["protocol"] = self.protocol
        if self.quality:
            key["quality"] = list(self.quality)
        if self.gpu and self.gpu is not DEFAULT_GPU:  # the default GPU counts as none
            key["gpu"] = self.gpu
        if self.timer in (Timer.CUDAGRAPH, Timer.PROCESS_TIME):  # another quantity than the default timer's
            key["timer"] = self.timer
        if self.flush_l2:
            key["flush_l2"] = True
        if self.compile:  # eager and compiled side by side in one suite
            key["compile"] = self.compile_mode or True
        blob = json.dumps(key, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Case:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class Budget:
    """Limits of one case: above ``max_memory_bytes`` of peak it is ``over_budget``; after ``max_seconds`` it is
    killed (``timeout``)."""

    max_memory_bytes: int | None = None
    max_seconds: float | None = None

    def __post_init__(self) -> None:
        coerce_fields(self)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Budget:
        return cls(**json.loads(text))


@dataclass
class Measurement:
    """What one case produced. Times are seconds per iteration (forward + backward when mode is fwd_bwd)."""

    status: Status
    error: str = ""
    peak_bytes: int | None = None
    reserved_bytes: int | None = None
    baseline_bytes: int | None = None
    times_s: list[float] = field(default_factory=list)
    fwd_times_s: list[float] = field(default_factory=list)
    bwd_times_s: list[float] = field(default_factory=list)
    flops: int | None = None
    device_name: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)  # torch/cuda version, threads, host, git sha
    extra: dict[str, Any] = field(default_factory=dict)  # optional columns (rel_err, grad_cos, ...)

    def __post_init__(self) -> None:
        coerce_fields(self)

    @property
    def time_median_s(self) -> float | None:
        return statistics.median(self.times_s) if self.times_s else None

    @property
    def time_mean_s(self) -> float | None:
        return statistics.fmean(self.times_s) if self.times_s else None

    @property
    def time_min_s(self) -> float | None:
        return min(self.times_s) if self.times_s else None

    @property
    def time_iqr_s(self) -> float | None:
        if len(self.times_s) < 2:
            return 0.0 if self.times_s else None
        q1, _, q3 = statistics.quantiles(self.times_s, n=4, method="inclusive")
        return q3 - q1

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Measurement:
        return cls(**json.loads(text))
