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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from topk_bench import protocol
from topk_bench.errors import BadInput
from topk_bench.machine import cores
from topk_bench.run import devices
from topk_bench.suite.schema import Suite
from topk_bench.suite.settings import ExecutorSettings, Settings
from topk_bench.suite.values import AtLeastOne, AtLeastZero, GiB, Jobs, Seconds, check_flag
from topk_bench.types import DeviceKind, DType, Method

DEVICE_CHOICES = ("auto", *DeviceKind.values())
EXECUTOR_CHOICES = ("local", "slurm")


@dataclass(frozen=True)
class Flags:
    """What the command line (or ``run_suite``'s keywords) gave; None: not given."""

    device: str | None = None
    predict: bool = False
    repeats: int | None = None
    warmup: int | None = None
    rounds: int | None = None
    max_memory_gib: float | None = None
    max_case_seconds: float | None = None
    executor: str | None = None
    jobs: int | str | None = None
    out: str | Path | None = None

    def check(self) -> None:
        """Each flag's value on its own (what it means against the suite is :func:`resolve`'s)."""
        # The types of the suite's and bench.toml's keys (topk_bench.suite.values): the same rules, the flag named.
        check_flag("--repeats", self.repeats, AtLeastOne)
        check_flag("--warmup", self.warmup, AtLeastZero)
        check_flag("--rounds", self.rounds, AtLeastOne)
        check_flag("--max-memory", self.max_memory_gib, GiB)
        check_flag("--max-case-seconds", self.max_case_seconds, Seconds)
        if self.executor is not None and self.executor not in EXECUTOR_CHOICES:
            raise BadInput(f"expected local or slurm, got {self.executor!r}", key="--executor")
        if self.device is not None and self.device not in DEVICE_CHOICES:
            raise BadInput(f"expected auto, cpu or cuda, got {self.device!r}", key="--device")
        jobs(self.jobs)

    @property
    def method(self) -> Method:
        return Method.PREDICTED if self.predict else Method.MEASURED


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


def layered(name: str, flags: Flags | None, suite: Suite | None, settings: Settings | None) -> Any:
    """The one rule of precedence: the command line's value, else the suite's, else bench.toml's (None: none)."""
    for source in (flags, suite, settings):
        value = getattr(source, name, None)
        if value is not None:
            return value
    return None


@dataclass(frozen=True)
class RunSettings:
    """Every setting of one run, resolved."""

    method: Method
    device: str                # "cpu" or "cuda": where cases run, or the device predicted for
    dtype: DType
    warmup: int
    repeats: int
    rounds: int                # child processes per case, round-robin over the cases
    max_memory_gib: float      # the memory budget asked (the plan caps it to what the device has)
    max_case_seconds: float
    max_cases: int
    executor: ExecutorSettings
    gpus: tuple[str, ...]      # a measured CUDA run on the local executor: the GPUs its job slots spread over
    out_dir: Path
    notes: tuple[str, ...]     # what the run says before it starts about how these were resolved

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
    fixed = protocol.lookup(suite.protocol)
    for flag, setting in (("--warmup", "warmup"), ("--repeats", "repeats")):
        problem = protocol.fixed_value_problem(suite.protocol, setting, getattr(flags, setting))
        if problem:
            raise BadInput(problem, key=flag)
    warmup = fixed.warmup if fixed.warmup is not None else layered("warmup", flags, suite, settings)
    repeats = fixed.repeats if fixed.repeats is not None else layered("repeats", flags, suite, settings)
    rounds = layered("rounds", flags, suite, None) or 1
    notes = []
    if rounds > 1 and suite.protocol != protocol.DEFAULT:
        raise BadInput(f"protocol {suite.protocol!r} fixes how each case is measured; rounds is for ours",
                       **({"key": "--rounds"} if flags.rounds is not None else {"file": suite.path, "key": "rounds"}))
    if rounds > 1 and flags.predict:
        notes.append(f"rounds = {rounds}: a prediction is exact, each case is predicted once")
        rounds = 1
    return warmup, repeats, rounds, notes


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
        notes.append(f"warning: {executor.jobs} jobs on a measured CPU run compete for cores: "
                     "times are not comparable with a --jobs 1 run")
    if kind is DeviceKind.CUDA and not flags.predict and executor.kind == "local":  # a prediction uses no GPU
        return _spread_over_gpus(executor, notes)
    return executor, (), notes


def _spread_over_gpus(executor: ExecutorSettings, notes: list[str]) -> tuple[ExecutorSettings, tuple[str, ...], list[str]]:
    """A measured local CUDA run: the GPUs its job slots use; with one GPU, one job (said in ``notes``)."""
    gpus = tuple(devices.visible_gpus(os.environ, torch.cuda.device_count()))
    count = executor.jobs
    if count > 1 and len(gpus) == 1:
        notes.append(f"one GPU visible: --jobs {count} lowered to 1 for this measured CUDA run "
                     "(cases sharing a GPU corrupt each other's times and peaks)")
        return executor.model_copy(update={"jobs": 1}), gpus, notes
    if count > len(gpus) > 1:
        notes.append(f"warning: {count} jobs on {len(gpus)} GPUs: job slots share GPUs (slot i on GPU i mod "
                     f"{len(gpus)}), so their times and peaks are not comparable with a --jobs {len(gpus)} run")
    return executor, gpus, notes


def resolve(settings: Settings, suite: Suite, flags: Flags) -> RunSettings:
    """Every setting of the run, each from the command line, else the suite, else bench.toml; BadInput when
    they contradict each other (a value the suite's protocol fixes)."""
    flags.check()
    device_ = device(flags.device or settings.device, flags.predict)
    warmup, repeats, rounds, notes = _iterations(suite, flags, settings)
    executor, gpus, executor_notes = _executor(settings, flags, device_)
    out = Path(flags.out) if flags.out is not None else settings.path(settings.results_dir)
    return RunSettings(
        method=flags.method, device=device_, dtype=DType(layered("dtype", None, suite, settings)),
        warmup=warmup, repeats=repeats, rounds=rounds, max_memory_gib=layered("max_memory_gib", flags, suite, settings),
        max_case_seconds=layered("max_case_seconds", flags, suite, settings),
        max_cases=layered("max_cases", None, suite, settings), executor=executor, gpus=gpus, out_dir=out,
        notes=(*notes, *executor_notes),
    )
