"""A suite planned for running: settings and overrides applied, cases expanded, budgets, output paths, header.

Everything that can be wrong with the input is checked here, before any file
is touched. Precedence of values: bench.toml, then the suite, then the
command line.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from topk_bench import protocol, workloads
from topk_bench.case import Budget, Case
from topk_bench.errors import BadInput
from topk_bench.machine import cores
from topk_bench.measure.iterations import compiles
from topk_bench.results import rates
from topk_bench.results.columns import (
    COMPILE_COLUMN, FIDELITY_COLUMNS, WORKSPACE_COLUMN, header as results_header, order_parameters, quality_columns,
)
from topk_bench.results.row import parameters
from topk_bench.run import devices
from topk_bench.suite import sweep
from topk_bench.suite.checks import check_suite
from topk_bench.suite.load import read_suite
from topk_bench.suite.schema import Suite
from topk_bench.suite.settings import ExecutorSettings, Settings, load_settings
from topk_bench.units import GIB, format_duration

# A new interpreter importing torch (the local template, once; each Slurm task): 2 to 5 s on 2 loaded cores.
INTERPRETER_S = 3.0
# A child forked from the warm template, before it measures (scripts/bench_child_overhead.py: tens of ms).
FORK_S = 0.25


@dataclass
class Plan:
    suite: Suite
    settings: Settings
    cases: list[Case]
    budget: Budget
    csv_path: Path
    meta_path: Path
    header: list[str]
    executor: ExecutorSettings
    notes: list[str] = field(default_factory=list)
    # A measured CUDA run on the local executor: the GPUs its job slots spread over (run/devices.py).
    gpus: list[str] = field(default_factory=list)
    # Child processes per case, round-robin over the cases (runner.py pools their times in one row).
    rounds: int = 1


def available_memory_bytes() -> int | None:
    """What the machine can still give (MemAvailable), the CPU's memory budget cap."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def device_memory_bytes(device: str) -> int | None:
    """The CUDA device's total memory, the CUDA memory budget's cap (the same query as its name in the
    rows' provenance, so the parent initialises nothing more)."""
    try:
        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    except (RuntimeError, AssertionError, ValueError):
        return None


def memory_cap(device: str, predict: bool) -> tuple[int | None, str]:
    """(bytes, what they are) that a case's memory budget may not exceed; None when nothing caps it.

    A measured CPU case must not push the machine into swap or the OOM killer (the memory available); a
    measured CUDA case cannot use more than its device has, so a budget above it could never be reached:
    past it the case is ``oom``, the device ran out. Predicting allocates nothing."""
    if predict:
        return None, ""
    if device.startswith("cuda"):
        return device_memory_bytes(device), "the device's memory"
    return available_memory_bytes(), "the available memory"


def capped_budget(asked: int, cap: int | None, what: str) -> tuple[int, str | None]:
    """The memory budget in bytes, at most ``cap``, with the note that says so when it was capped."""
    if cap is None or cap >= asked:
        return asked, None
    return cap, f"memory budget capped to {what}, {cap / GIB:.1f} GiB (asked {asked / GIB:g} GiB)"


def _check_override(flag: str, value: Any, minimum: float, strict: bool = False) -> None:
    if value is None:
        return
    bad = isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum or (strict and value <= minimum)
    if bad:
        bound = f"> {minimum}" if strict else f">= {minimum}"
        raise BadInput(f"expected a number {bound}, got {value!r}", key=flag)


def _jobs(value: int | str | None) -> int | None:
    """``--jobs``: a number, or ``auto`` for one case per core."""
    if isinstance(value, str):
        if value.strip().lower() == "auto":
            return cores()
        try:
            value = int(value)
        except ValueError:
            raise BadInput(f"expected a number >= 1 or auto, got {value!r}", key="--jobs") from None
    _check_override("--jobs", value, 1)
    return value


def _device(requested: str, predict: bool = False) -> str:
    """The device cases run on, or (``predict``) are predicted for: ``cuda`` only when asked for, no GPU needed."""
    if requested not in ("auto", "cpu", "cuda"):
        raise BadInput(f"expected auto, cpu or cuda, got {requested!r}", key="--device")
    if predict:
        return "cuda" if requested == "cuda" else "cpu"
    if requested == "cpu":
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    if requested == "cuda":
        raise BadInput("no CUDA device is available (torch.cuda.is_available() is False)", key="--device")
    return "cpu"


def _spread_over_gpus(executor: ExecutorSettings, notes: list[str]) -> tuple[ExecutorSettings, list[str]]:
    """A measured local CUDA run: the GPUs its job slots use; with one GPU, one job (said in ``notes``)."""
    gpus = devices.visible_gpus(os.environ, torch.cuda.device_count())
    jobs = executor.jobs
    if jobs > 1 and len(gpus) == 1:
        notes.append(f"one GPU visible: --jobs {jobs} lowered to 1 for this measured CUDA run "
                     "(cases sharing a GPU corrupt each other's times and peaks)")
        return executor.model_copy(update={"jobs": 1}), gpus
    if jobs > len(gpus) > 1:
        notes.append(f"warning: {jobs} jobs on {len(gpus)} GPUs: job slots share GPUs (slot i on GPU i mod "
                     f"{len(gpus)}), so their times and peaks are not comparable with a --jobs {len(gpus)} run")
    return executor, gpus


def plan(suite_path: str | Path, *, config: str | Path | None = None, out: str | Path | None = None,
         device: str | None = None, predict: bool = False, repeats: int | None = None, warmup: int | None = None,
         max_memory_gib: float | None = None, max_case_seconds: float | None = None,
         executor: str | None = None, jobs: int | str | None = None, rounds: int | None = None,
         yes: bool = False) -> Plan:
    """Settings (bench.toml < suite < arguments), the cases and their budget. Raises BadInput; writes nothing.

    A suite of more cases than ``max_cases`` is bad input unless ``yes``, said before its cases are even built.
    """
    _check_override("--repeats", repeats, 1)
    _check_override("--warmup", warmup, 0)
    _check_override("--rounds", rounds, 1)
    _check_override("--max-memory", max_memory_gib, 0, strict=True)
    _check_override("--max-case-seconds", max_case_seconds, 0, strict=True)
    jobs = _jobs(jobs)
    if executor is not None and executor not in ("local", "slurm"):
        raise BadInput(f"expected local or slurm, got {executor!r}", key="--executor")
    settings = load_settings(config)
    suite = read_suite(suite_path)
    notes: list[str] = []

    method = "predicted" if predict else "measured"
    dev = _device(device or settings.device, predict)
    pick = lambda *values: next(v for v in values if v is not None)  # noqa: E731  (the first one given)
    memory_gib = pick(max_memory_gib, suite.max_memory_gib, settings.max_memory_gib)
    seconds = pick(max_case_seconds, suite.max_case_seconds, settings.max_case_seconds)
    memory, capped = capped_budget(int(memory_gib * GIB), *memory_cap(dev, predict))
    notes += [capped] if capped else []
    fixed = protocol.get(suite.protocol)
    for flag, setting, value in (("--warmup", "warmup", warmup), ("--repeats", "repeats", repeats)):
        problem = protocol.fixed_value_problem(suite.protocol, setting, value)
        if problem:
            raise BadInput(problem, key=flag)
    n_rounds = pick(rounds, suite.rounds, 1)
    if n_rounds > 1 and suite.protocol != protocol.DEFAULT:
        raise BadInput(f"protocol {suite.protocol!r} fixes how each case is measured; rounds is for ours",
                       **({"key": "--rounds"} if rounds is not None else {"file": suite.path, "key": "rounds"}))
    if n_rounds > 1 and predict:
        notes.append(f"rounds = {n_rounds}: a prediction is exact, each case is predicted once")
        n_rounds = 1

    updates: dict[str, Any] = {}
    if executor is not None:
        updates["kind"] = executor
    if jobs is not None:
        updates["jobs"] = jobs
    elif predict and settings.executor.kind == "local":
        # Predicting uses no memory and measures no time: --jobs auto, one case per core.
        updates["jobs"] = cores()
    # Relative paths of bench.toml are relative to that file, the Slurm log folder too.
    updates["log_dir"] = str(settings.path(settings.executor.log_dir))
    executor_settings = settings.executor.model_copy(update=updates)
    if executor_settings.jobs > 1 and dev == "cpu" and not predict:
        notes.append(f"warning: {executor_settings.jobs} jobs on a measured CPU run compete for cores: "
                     "times are not comparable with a --jobs 1 run")
    gpus: list[str] = []
    if dev == "cuda" and not predict and executor_settings.kind == "local":  # a prediction uses no GPU
        executor_settings, gpus = _spread_over_gpus(executor_settings, notes)

    max_cases = pick(None, suite.max_cases, settings.max_cases)
    cpu_measured = dev == "cpu" and not predict
    count = sweep.count(suite, suite.cpu_max if cpu_measured else None)  # the cases this run will build
    if count > max_cases and not yes:
        raise BadInput(f"{count} cases, {estimate(count, seconds, executor_settings)}: more than max_cases = "
                       f"{max_cases}; pass --yes to run them, or raise max_cases in the suite or bench.toml",
                       file=suite.path, key="max_cases")
    check_suite(suite, suite.path)
    cases = sweep.expand(
        suite, device=dev, method=method, dtype=pick(None, suite.dtype, settings.dtype),
        warmup=pick(fixed.warmup, warmup, suite.warmup, settings.warmup),
        repeats=pick(fixed.repeats, repeats, suite.repeats, settings.repeats),
    )
    if cpu_measured and suite.cpu_max:
        cases, above = within(cases, suite.cpu_max)
        if above:
            limits = ", ".join(f"{k} <= {v}" for k, v in suite.cpu_max.items())
            notes.append(f"cpu_max: {above} case(s) above {limits} left out of this measured CPU run")

    out_dir = Path(out) if out is not None else settings.path(settings.results_dir)
    for place in (out_dir, *out_dir.parents):  # the nearest that exists must be a directory
        if place.exists():
            if not place.is_dir():
                raise BadInput("expected a directory" + (f", but {place} is a file" if place != out_dir else ""),
                               file=out_dir, key="--out")
            break
    return Plan(
        suite=suite, settings=settings, cases=cases, budget=Budget(memory, seconds),
        csv_path=out_dir / f"{suite.name}.csv", meta_path=out_dir / f"{suite.name}.meta.json",
        header=results_header(parameters_of(cases), optional_columns(suite, cases)),
        executor=executor_settings, notes=notes, gpus=gpus, rounds=n_rounds,
    )


def estimate(n: int, seconds: float | None, executor: ExecutorSettings) -> str:
    """How long ``n`` cases take: from the children's start-up alone to every case using its whole time budget."""
    local = executor.kind == "local"
    at_once = executor.jobs if local else executor.array_parallelism
    waves = math.ceil(n / at_once)
    budget = seconds or 0.0
    # Locally one template starts, then each case is a fork; a Slurm task starts an interpreter of its own.
    once, each = (INTERPRETER_S, FORK_S) if local else (0.0, INTERPRETER_S + FORK_S)
    low, high = once + waves * each, once + waves * (each + budget)
    return (f"{format_duration(low)} to {format_duration(high)} "
            f"({at_once} at a time, each from ~{each:g} s of start-up to its {budget:g} s time budget)")


def size_note(the_plan: Plan, todo: int) -> str:
    """The line a run starts with: how many cases, how long."""
    done = len(the_plan.cases) - todo
    rounds = f", each in {the_plan.rounds} rounds" if the_plan.rounds > 1 else ""
    return (f"{todo} case{'' if todo == 1 else 's'} to run ({done} already in {the_plan.csv_path.name}){rounds}, "
            f"estimate {estimate(todo * the_plan.rounds, the_plan.budget.max_seconds, the_plan.executor)}")


def within(cases: list[Case], limits: dict[str, int]) -> tuple[list[Case], int]:
    """(the cases whose swept sizes are all within ``limits``, how many were above)."""
    kept = [c for c in cases if all(c.param_dict.get(k, c.option_dict.get(k, 0)) <= v for k, v in limits.items())]
    return kept, len(cases) - len(kept)


def parameters_of(cases: list[Case]) -> list[str]:
    """The parameter columns of a run's cases, in the header's order."""
    return order_parameters(name for case in cases for name in parameters(case))


def optional_columns(suite: Suite, cases: list[Case]) -> tuple[str, ...]:
    """The result columns this run fills: the workspace when measured on CUDA, fidelity when the suite asks,
    its workloads' own, and the traffic and rate columns of workloads that state a cost model."""
    cuda = any(c.method == "measured" and c.device.startswith("cuda") for c in cases)
    own = [c for name in dict.fromkeys(case.workload for case in cases) for c in workloads.get(name).columns]
    traffic = {c for case in cases for c in rates.names(workloads.traffic(case))}
    quality = tuple(c for kind in dict.fromkeys(suite.quality) for c in quality_columns(kind))
    compiled = any(c.method == "measured" and compiles(c) for c in cases)
    return (((WORKSPACE_COLUMN,) if cuda else ()) + ((COMPILE_COLUMN,) if compiled else ()) + (FIDELITY_COLUMNS if suite.fidelity else ()) + quality
            + tuple(dict.fromkeys(own)) + tuple(c for c in rates.COLUMNS if c in traffic))


def meta(the_plan: Plan) -> dict[str, Any]:
    """``<suite>.meta.json``: what ``topk-bench plot`` needs beyond the CSV (docs/CONTRACTS.md)."""
    suite = the_plan.suite
    plot = suite.plot.model_dump()
    plot["x"] = plot["x"] or next(iter(suite.sweep))
    plot["panels"] = [list(p) for p in plot["panels"]]
    return {
        "suite": suite.name, "title": suite.title, "workload": suite.workload, "mode": suite.mode,
        "causal": suite.causal, "activation": suite.activation, "protocol": suite.protocol,
        "sweep": list(suite.sweep), "plot": plot,
        # Which columns of the CSV are parameters (a plug-in workload's result columns are not known to readers).
        "parameters": parameters_of(the_plan.cases),
    }


