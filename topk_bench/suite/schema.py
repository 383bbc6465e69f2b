"""A suite file's keys and types (pydantic): what ``topk-bench run SUITE.toml`` accepts.

Unknown keys are errors. What the values mean against the workloads and the
implementation registry (names, options, sizes, masking) is checked next, by
:mod:`topk_bench.suite.checks`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from topk_bench.protocol import DEFAULT as DEFAULT_PROTOCOL
from topk_bench.protocol import PROTOCOLS, Protocol
from topk_bench.protocol import lookup as lookup_protocol
from topk_bench.suite.files import Strict
from topk_bench.suite.values import AtLeastOne, AtLeastZero, GiB, SampleSeconds, Seconds, Threads, WarmupSeconds
from topk_bench.types import DType, Mode, Timer
from topk_bench.untrusted import NAME_MAX, NAME_PATTERN

# Literal[Mode.values()] and the like: pydantic checks a file's value against the enum's spellings; mypy
# takes only literal values in a Literal, hence its valid-type error ignored on those fields.

# torch.compile's modes (``compile_mode``): None is its default.
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]


class PlotSection(Strict):
    """``[plot]``: how ``topk-bench plot`` draws the suite (written to ``<suite>.meta.json``)."""

    x: str | None = None  # column on the x axis; default: the (first) swept parameter
    x_label: str | None = None  # default: chosen by the plotter from the column name
    # 0: linear; otherwise the log base; None (not given): log2 for a geometric sweep (1K, 2K, 4K: on a linear axis
    # its small sizes' ticks print over one another), else linear (report/plots/spec.py, infer_spec).
    log_x: int | None = Field(None, ge=0)
    log_y: bool = False
    panels: list[list[float]] = Field(default_factory=list)  # [xmin, xmax] ranges, side by side
    metrics: list[str] = Field(
        default_factory=lambda: ["memory", "time"], min_length=1
    )  # topk_bench.results.columns.METRICS
    # Which peak the "memory" row draws: allocated (peak_bytes), or reserved (reserved_bytes, the paper's
    # metric) for the figures whose rows have it (CUDA); topk-bench plot --memory overrides.
    memory: Literal["allocated", "reserved"] = "allocated"
    split: list[str] = Field(default_factory=list)  # parameters with one figure per value (model): not one curve each
    renderer: str | None = None  # "module:function" of a plug-in renderer
    pareto: bool = False  # also quality against time (suites with quality columns): report/plots/pareto.py

    @field_validator("log_x")
    @classmethod
    def _base(cls, value: int | None) -> int | None:
        if value == 1:
            raise ValueError(f"0 (linear) or a log base of at least 2, got {value}")
        return value

    @field_validator("panels")
    @classmethod
    def _ranges(cls, value: list[list[float]]) -> list[list[float]]:
        for pair in value:
            if len(pair) != 2 or not pair[0] < pair[1]:
                raise ValueError(f"[xmin, xmax] ranges with xmin < xmax, got {pair}")
        return value


class ImplEntry(BaseModel):
    """One ``[[impl]]``: a registry name, an optional legend and the implementation's options inline."""

    model_config = ConfigDict(extra="allow", strict=True)

    name: str
    label: str | None = None
    # Per-entry workload and its masking/activation (default: the suite's), so that one
    # suite (smoke.toml) can cover every workload; [shape]/[sweep] keys a workload lacks do not apply to it.
    workload: str | None = None
    causal: bool | None = None
    activation: Literal["softmax", "relu"] | None = None
    # Default: the suite's mode.
    mode: Literal[Mode.values()] | None = None  # type: ignore[valid-type]  # a Literal built at run time
    # Default: the suite's dtype (else bench.toml's): one suite can time a bf16 decode step beside an fp32 training
    # step.
    dtype: Literal[DType.values()] | None = None  # type: ignore[valid-type]  # a Literal built at run time
    feedforward: str | None = None  # workloads with a feed-forward sublayer: its implementation
    feedforward_options: dict[str, Any] = Field(default_factory=dict)
    # torch.compile the entry's attention modules (its compile time outside the timed region: compile_s);
    # compile_mode: torch.compile's mode. An entry without it is eager, so both can run side by side.
    compile: bool = False
    compile_mode: CompileMode | None = None

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


# The keys of a suite that make its cases (Suite.fingerprint).
_MAKES_CASES = (
    "workload",
    "mode",
    "causal",
    "activation",
    "dtype",
    "seed",
    "timer",
    "flush_l2",
    "plugins",
    "fidelity",
    "protocol",
    "quality",
    "shape",
    "sweep",
    "impl",
)


class Suite(Strict):
    # It names files (OUT/<name>.csv, a figure's name): the one rule of a name that may be part of one.
    name: str = Field(pattern=NAME_PATTERN, max_length=NAME_MAX)
    title: str = ""
    workload: str  # a registered workload (topk_bench.workloads)
    # Default: the workload's mode (fwd_bwd; fwd for prefill, decode).
    mode: Literal[Mode.values()] | None = None  # type: ignore[valid-type]  # a Literal built at run time
    causal: bool | None = None  # default: the workload's
    activation: Literal["softmax", "relu"] | None = None  # default: the workload's
    dtype: Literal[DType.values()] | None = None  # type: ignore[valid-type]  # a Literal built at run time
    seed: int = Field(0, ge=0)
    repeats: AtLeastOne | None = None
    warmup: AtLeastZero | None = None
    warmup_s: WarmupSeconds | None = None  # the warm-up also lasts at least this many seconds
    # Measured on CUDA: "events" around each eager iteration (default), or "cudagraph": each timed iteration a
    # replay of one iteration captured in a CUDA graph (memory from the eager iterations before it). On the CPU:
    # "perf_counter" (wall, default) or "process_time" (the process's CPU seconds).
    timer: Literal[Timer.choices()] | None = None  # type: ignore[valid-type]  # a Literal built at run time
    # Each timed sample runs the iteration back to back until it lasts this long (its time: their mean).
    min_sample_s: SampleSeconds | None = None
    flush_l2: bool | None = None  # the device's cache flushed between timed iterations, outside the timing
    # Measured runs: each case in this many child processes, round-robin over the cases, its row pooling
    # every round's times (load that drifts over minutes spreads over all cases alike).
    rounds: AtLeastOne | None = None
    threads: Threads | None = None  # intra-op CPU threads of a measured case: a number, or "auto"
    max_memory_gib: GiB | None = None
    max_case_seconds: Seconds | None = None
    max_cases: int | None = Field(None, ge=1)  # a suite of more cases than this runs only with --yes
    plugins: list[str] = Field(default_factory=list)
    fidelity: bool = False
    # One of topk_bench.protocol's.
    protocol: Literal[tuple(PROTOCOLS)] = DEFAULT_PROTOCOL  # type: ignore[valid-type]  # a Literal built at run time
    # Selection-quality columns against exact attention, on these inputs: "random" (the case's own),
    # "minilm" (the pretrained MiniLM's activations), "peaked" (synthetic sinks, locality, heavy hitters); a
    # string names one.
    quality: list[Literal["random", "minilm", "peaked"]] = Field(default_factory=list)
    shape: dict[str, int | float | str] = Field(default_factory=dict)
    # Sizes; or names, for a parameter that takes them (model = ["llama-3-8b", "bert-base"]).
    sweep: dict[str, list[int] | list[str]] = Field(min_length=1)
    # A measured run on the CPU leaves out the cases above these swept sizes (--predict: the whole sweep).
    cpu_max: dict[str, int] = Field(default_factory=dict)
    impl: list[ImplEntry] = Field(min_length=1)
    plot: PlotSection = Field(default_factory=PlotSection)
    _path: Path | None = PrivateAttr(None)  # the file it was read from

    @field_validator("quality", mode="before")
    @classmethod
    def _one_kind(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @property
    def path(self) -> Path | None:
        return self._path

    @property
    def fingerprint(self) -> str:
        """A hash of what makes the suite's cases (workload, implementations and their options and labels, sweep,
        shape, masking, dtype, seed, protocol, timer, extra columns, plug-ins): two suites of one name with
        different fingerprints are two suites, and do not share a results file unless told to (``run
        --append``). How the cases are run and drawn (repeats, rounds, budgets, cpu_max, title, [plot]) is not
        in it: changing those keeps the suite the same."""
        data = self.model_dump(mode="json", include=set(_MAKES_CASES))
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def measured_by(self) -> Protocol:
        """The suite's protocol, resolved: what it fixes and owns (:mod:`topk_bench.protocol`)."""
        return lookup_protocol(self.protocol)
