"""A run's settings, resolved once: bench.toml, then the suite, then the command line.

:class:`Flags` is what the command line gave (checked here: the same rules as the
suite's keys); :func:`resolve` applies the one rule of precedence (:func:`layered`)
and the protocol's fixed values, and returns a frozen :class:`RunSettings`: how the
cases are measured (method, device, dtype, iterations, rounds), the budget asked,
where cases run (executor, GPUs) and where rows go. Nothing is read from a case
afterwards that the run as a whole decides.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from topk_bench import machine, protocol
from topk_bench.case import Measuring
from topk_bench.errors import BadInput
from topk_bench.machine import cores
from topk_bench.results import trust
from topk_bench.run import devices
from topk_bench.suite import overrides
from topk_bench.suite.schema import Suite
from topk_bench.suite.settings import ExecutorSettings, Settings
from topk_bench.suite.values import (
    AtLeastOne,
    AtLeastZero,
    GiB,
    Jobs,
    SampleSeconds,
    Seconds,
    Threads,
    WarmupSeconds,
    check_flag,
)
from topk_bench.types import DEFAULT_GPU, DeviceKind, DType, GpuModel, Method, Timer
from topk_bench.units import GIB

DEVICE_CHOICES = ("auto", *DeviceKind.values())
EXECUTOR_CHOICES = ("local", "slurm")


@dataclass(frozen=True)
class Flags:
    """What the command line (or ``run_suite``'s keywords) gave; None: not given. Each value is checked on its
    own when the flags are made (:meth:`check`: BadInput naming the flag); what it means against the suite is
    :func:`resolve`'s."""

    device: str | None = None
    predict: bool = False
    repeats: int | None = None
    warmup: int | None = None
    warmup_s: float | None = None
    min_sample_s: float | None = None
    timer: str | None = None
    flush_l2: bool | None = None
    rounds: int | None = None
    max_memory_gib: float | None = None
    max_case_seconds: float | None = None
    executor: str | None = None
    jobs: int | str | None = None
    threads: int | str | None = None
    remeasure: str | tuple[str, ...] | None = None
    out: str | Path | None = None
    gpu: str | None = None
    profile: bool = False
    # --set KEY=VALUES (repeatable): the suite's values replaced for this run (topk_bench.suite.overrides); a
    # mapping key -> values from run_suite.
    sets: tuple[str, ...] | Mapping[str, Any] = ()

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Each flag's value on its own (what it means against the suite is :func:`resolve`'s)."""
        # The types of the suite's and bench.toml's keys (topk_bench.suite.values): the same rules, the flag named.
        check_flag("--repeats", self.repeats, AtLeastOne)
        check_flag("--warmup", self.warmup, AtLeastZero)
        check_flag("--warmup-s", self.warmup_s, WarmupSeconds)
        check_flag("--min-sample-s", self.min_sample_s, SampleSeconds)
        if self.timer is not None and self.timer not in Timer.choices():
            raise BadInput(f"expected one of {', '.join(Timer.choices())}, got {self.timer!r}", key="--timer")
        check_flag("--rounds", self.rounds, AtLeastOne)
        check_flag("--max-memory", self.max_memory_gib, GiB)
        check_flag("--max-case-seconds", self.max_case_seconds, Seconds)
        if self.executor is not None and self.executor not in EXECUTOR_CHOICES:
            raise BadInput(f"expected local or slurm, got {self.executor!r}", key="--executor")
        if self.device is not None and self.device not in DEVICE_CHOICES:
            raise BadInput(f"expected auto, cpu or cuda, got {self.device!r}", key="--device")
        if self.gpu is not None:
            try:
                GpuModel.parse(self.gpu, "GPU")
            except ValueError as exc:
                raise BadInput(str(exc), key="--gpu") from None
        jobs(self.jobs)
        threads_value(self.threads, "--threads")
        remeasure_flags(self.remeasure)
        overrides.parse(self.sets)

    @property
    def method(self) -> Method:
        return Method.PREDICTED if self.predict else Method.MEASURED

    @property
    def overrides(self) -> overrides.Overrides:
        """``--set``'s keys and values, parsed (:meth:`check` made sure they parse)."""
        return overrides.parse(self.sets)


def jobs(value: int | str | None) -> int | None:
    """``--jobs``: a number, or ``auto`` for one case per core."""
    if isinstance(value, str):
        if value.strip().lower() == "auto":
            return cores()
        try:
            value = int(value)
        except ValueError:
            raise BadInput(f"expected a number >= 1 or auto, got {value!r}", key="--jobs") from None
    check_flag("--jobs", value, Jobs)
    return value


def threads_value(value: int | str | None, key: str) -> int | str | None:
    """A thread setting: a number, or ``auto`` (None: not given); the command line's text read as one."""
    if isinstance(value, str):
        text = value.strip().lower()
        value = "auto" if text == "auto" else int(text) if text.isdigit() else value
    check_flag(key, value, Threads)
    return value


def remeasure_flags(value: str | tuple[str, ...] | None) -> frozenset[str]:
    """``--remeasure``: trust flags (``contended,busy,noisy``), comma-separated; empty when not given."""
    if value is None:
        return frozenset()
    names = [v.strip() for v in (value.split(",") if isinstance(value, str) else value)]
    unknown = [n for n in names if n not in trust.FLAGS]
    if unknown or not names:
        raise BadInput(
            f"expected trust flags among {', '.join(trust.FLAGS)}, comma-separated, got {value!r}", key="--remeasure"
        )
    return frozenset(names)


def layered(name: str, flags: Flags | None, suite: Suite | None, settings: Settings | None) -> Any:
    """The one rule of precedence: the command line's value, else the suite's, else bench.toml's (None: none)."""
    for source in (flags, suite, settings):
        value = getattr(source, name, None)
        if value is not None:
            return value
    return None


@dataclass(frozen=True)
class RunSettings(Measuring):
    """Every setting of one run, resolved: how its cases are measured (:class:`~topk_bench.case.Measuring`), and
    how the run goes."""

    rounds: int  # child processes per case, round-robin over the cases
    remeasure: frozenset[str]  # trust flags whose rows run again (--remeasure); empty: resume as usual
    max_memory_gib: float  # the memory budget asked (the plan caps it to what the device has)
    max_case_seconds: float
    max_cases: int
    executor: ExecutorSettings
    gpus: tuple[str, ...]  # a measured CUDA run on the local executor: the GPUs its job slots spread over
    out_dir: Path
    notes: tuple[str, ...]  # what the run says before it starts about how these were resolved
    profile: bool = False  # each case also writes its profile, to out_dir/profile/<case_id>/

    @property
    def predicted(self) -> bool:
        return self.method is Method.PREDICTED

    def measured_on(self, kind: DeviceKind) -> bool:
        return self.method is Method.MEASURED and DeviceKind(self.device) is kind


def device(requested: str, predict: bool = False) -> str:
    """The device cases run on, or (``predict``) are predicted for: ``cuda`` only when asked for, no GPU needed."""
    if predict:
        return DeviceKind.CUDA.value if requested == DeviceKind.CUDA else DeviceKind.CPU.value
    if requested == DeviceKind.CPU:
        return DeviceKind.CPU.value
    if torch.cuda.is_available():
        return DeviceKind.CUDA.value
    if requested == DeviceKind.CUDA:
        raise BadInput("no CUDA device is available (torch.cuda.is_available() is False)", key="--device")
    return DeviceKind.CPU.value


def _iterations(suite: Suite, flags: Flags, settings: Settings) -> tuple[int, int, int, list[str]]:
    """(warmup, repeats, rounds, notes): what the protocol fixes, else the layers' values."""
    fixed = suite.measured_by
    for flag, setting in (
        ("--warmup", "warmup"),
        ("--repeats", "repeats"),
        ("--warmup-s", "warmup_s"),
        ("--min-sample-s", "min_sample_s"),
        ("--timer", "timer"),
        ("--flush-l2", "flush_l2"),
    ):
        problem = suite.measured_by.fixed_value_problem(setting, getattr(flags, setting))
        if problem:
            raise BadInput(problem, key=flag)
    warmup = fixed.warmup if fixed.warmup is not None else layered("warmup", flags, suite, settings)
    repeats = fixed.repeats if fixed.repeats is not None else layered("repeats", flags, suite, settings)
    rounds = layered("rounds", flags, suite, None) or 1
    notes = []
    if rounds > 1 and suite.protocol != protocol.DEFAULT:
        raise BadInput(
            f"protocol {suite.protocol!r} fixes how each case is measured; rounds is for ours",
            **({"key": "--rounds"} if flags.rounds is not None else {"file": suite.path, "key": "rounds"}),
        )
    if rounds > 1 and flags.predict:
        notes.append(f"rounds = {rounds}: a prediction is exact, each case is predicted once")
        rounds = 1
    return warmup, repeats, rounds, notes


@dataclass(frozen=True)
class Timing:
    """How a measured case is timed: the warm-up's seconds, each sample's, the timer (None: the device's
    default), the cache flush."""

    warmup_s: float
    min_sample_s: float
    timer: Timer | None
    flush_l2: bool


def _timing(suite: Suite, flags: Flags, settings: Settings, device_: str) -> tuple[Timing, list[str]]:
    """(how a measured case is timed, notes). A prediction times nothing (its memory is the eager iterations',
    whatever the timer); a timer of the other device is left out, and the notes say so."""
    fixed = suite.measured_by

    def setting(name: str) -> Any:
        value = getattr(fixed, name)
        return value if value is not None else layered(name, flags, suite, settings)

    warmup_s, min_sample_s = setting("warmup_s"), setting("min_sample_s")
    asked = layered("timer", flags, suite, None)
    flush = bool(layered("flush_l2", flags, suite, None))
    if flags.predict:
        return Timing(warmup_s, 0.0, None, False), []
    timer = Timer(asked) if asked else None
    kind = DeviceKind(device_)
    if timer is not None and timer.device_kind is not kind:
        default = Timer.PERF_COUNTER if kind is DeviceKind.CPU else Timer.EVENTS
        other = timer.device_kind.value.upper()
        note = f"timer = {asked}: a {other} timer; this {kind.value.upper()} run uses {default}"
        return Timing(warmup_s, min_sample_s, None, flush), [note]
    return Timing(warmup_s, min_sample_s, timer, flush), []


def _executor(settings: Settings, flags: Flags, device_: str) -> tuple[ExecutorSettings, tuple[str, ...], list[str]]:
    """(executor settings, GPUs of the job slots, notes): the flags over bench.toml's ``[executor]``."""
    updates: dict[str, Any] = {}
    if flags.executor is not None:
        updates["kind"] = flags.executor
    asked = jobs(flags.jobs)
    if asked is not None:
        updates["jobs"] = asked
    elif flags.predict and settings.executor.kind == "local":
        updates["jobs"] = cores()  # predicting uses no memory and measures no time: one case per core
    # Relative paths of bench.toml are relative to that file, the Slurm log folder too.
    updates["log_dir"] = str(settings.path(settings.executor.log_dir))
    executor = settings.executor.model_copy(update=updates)
    notes: list[str] = []
    kind = DeviceKind(device_)
    if executor.jobs > 1 and kind is DeviceKind.CPU and not flags.predict:
        notes.append(
            f"warning: {executor.jobs} jobs on a measured CPU run compete for cores: "
            "times are not comparable with a --jobs 1 run"
        )
    if kind is DeviceKind.CUDA and not flags.predict and executor.kind == "local":  # a prediction uses no GPU
        return _spread_over_gpus(executor, notes)
    return executor, (), notes


def _spread_over_gpus(
    executor: ExecutorSettings, notes: list[str]
) -> tuple[ExecutorSettings, tuple[str, ...], list[str]]:
    """A measured local CUDA run: the GPUs its job slots use; with one GPU, one job (said in ``notes``)."""
    gpus = tuple(devices.visible_gpus(os.environ, torch.cuda.device_count()))
    count = executor.jobs
    if count > 1 and len(gpus) == 1:
        notes.append(
            f"one GPU visible: --jobs {count} lowered to 1 for this measured CUDA run "
            "(cases sharing a GPU corrupt each other's times and peaks)"
        )
        return executor.model_copy(update={"jobs": 1}), gpus, notes
    if count > len(gpus) > 1:
        notes.append(
            f"warning: {count} jobs on {len(gpus)} GPUs: job slots share GPUs (slot i on GPU i mod "
            f"{len(gpus)}), so their times and peaks are not comparable with a --jobs {len(gpus)} run"
        )
    return executor, gpus, notes


def predicted_gpu(flags: Flags, device_: str) -> GpuModel | None:
    """The GPU a CUDA prediction models; ``--gpu`` anywhere else is bad input (a measured run reads its own)."""
    if not (flags.predict and DeviceKind(device_) is DeviceKind.CUDA):
        if flags.gpu is not None:
            raise BadInput("names the GPU a CUDA prediction models: give it with --predict --device cuda", key="--gpu")
        return None
    return GpuModel.parse(flags.gpu, "GPU") if flags.gpu is not None else DEFAULT_GPU


def memory_budget_gib(flags: Flags, suite: Suite, settings: Settings, gpu: GpuModel | None) -> tuple[float, list[str]]:
    """(the memory budget asked, in GiB; notes). A CUDA prediction is judged against the modelled part's memory:
    bench.toml's default is the CPU's (the paper's 30 GiB), so only ``--max-memory`` or the suite's own value
    replaces the part's, and never above it (as a measured case cannot use more than its device has)."""
    if gpu is None:
        return layered("max_memory_gib", flags, suite, settings), []
    from topk_bench.predict.kernels.gpus import gpu as gpu_of  # the catalogue loads torch's kernel rules: lazily

    part = gpu_of(gpu)
    memory = part.memory_bytes / GIB
    asked = layered("max_memory_gib", flags, suite, None)
    if asked is None:
        return memory, []
    if asked > memory:
        return memory, [
            f"memory budget capped to the memory of the modelled {gpu.value}, {memory:.1f} GiB (asked {asked:g} GiB)"
        ]
    return asked, []


def _threads(settings: Settings, suite: Suite, flags: Flags, executor: ExecutorSettings) -> tuple[int, list[str]]:
    """(threads of each case, notes). A prediction computes nothing: one. ``auto``: on Slurm the CPUs a job
    is given (``cpus_per_task``); here, the cores other processes are not keeping busy now, shared by the
    job slots, so that a measured run does not oversubscribe a shared machine."""
    if flags.predict:
        return 1, []
    asked = threads_value(layered("threads", flags, suite, settings), "threads")
    if isinstance(asked, int):  # else "auto" (threads_value checked it)
        return asked, []
    if executor.kind == "slurm":
        return executor.cpus_per_task, [
            f"threads = auto: {executor.cpus_per_task} per case (cpus_per_task of "
            "bench.toml's [executor], what each Slurm job is given)"
        ]
    busy = machine.busy_now()
    free = machine.free_cores(busy)
    threads = max(1, free // executor.jobs)
    seen = f"{busy:.1f} of {cores()} cores kept busy by other processes" if busy is not None else "load unknown"
    slots = f", shared by {executor.jobs} jobs" if executor.jobs > 1 else ""
    return threads, [f"threads = auto: {threads} per case ({seen}{slots}; --threads N to choose)"]


def resolve(settings: Settings, suite: Suite, flags: Flags) -> RunSettings:
    """Every setting of the run, each from the command line, else the suite, else bench.toml; BadInput when
    they contradict each other (a value the suite's protocol fixes)."""
    device_ = device(flags.device or settings.device, flags.predict)
    gpu = predicted_gpu(flags, device_)
    warmup, repeats, rounds, notes = _iterations(suite, flags, settings)
    timing, timing_notes = _timing(suite, flags, settings, device_)
    executor, gpus, executor_notes = _executor(settings, flags, device_)
    threads, thread_notes = _threads(settings, suite, flags, executor)
    max_memory_gib, memory_notes = memory_budget_gib(flags, suite, settings, gpu)
    out = Path(flags.out) if flags.out is not None else settings.path(settings.results_dir)
    return RunSettings(
        method=flags.method,
        device=device_,
        dtype=DType(layered("dtype", None, suite, settings)),
        warmup=warmup,
        warmup_s=timing.warmup_s,
        min_sample_s=timing.min_sample_s,
        repeats=repeats,
        timer=timing.timer,
        flush_l2=timing.flush_l2,
        rounds=rounds,
        threads=threads,
        remeasure=remeasure_flags(flags.remeasure),
        max_memory_gib=max_memory_gib,
        max_case_seconds=layered("max_case_seconds", flags, suite, settings),
        max_cases=layered("max_cases", None, suite, settings),
        executor=executor,
        gpus=gpus,
        out_dir=out,
        notes=(*notes, *timing_notes, *executor_notes, *thread_notes, *memory_notes),
        gpu=gpu,
        profile=flags.profile,
    )
