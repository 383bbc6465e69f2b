"""A suite planned for running: its settings resolved, its cases expanded, their budget, output paths, header.

Everything that can be wrong with the input is checked here, before any file
is touched. The settings are resolved once (:mod:`.resolve`: bench.toml, then
the suite, then the command line); the plan then only expands the suite into
cases, caps their budget to what the machine has, and names the header.
"""

from __future__ import annotations

import datetime
import math
import os
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from implementations import provenance
from topk_bench import workloads
from topk_bench.case import Budget, Case
from topk_bench.errors import BadInput
from topk_bench.measure import metadata
from topk_bench.measure.iterations import compiles
from topk_bench.results import columns as col
from topk_bench.results import rates, store
from topk_bench.results.columns import header as results_header
from topk_bench.results.columns import order_parameters, quality_columns
from topk_bench.results.row import parameters
from topk_bench.run.resolve import Flags, RunSettings, resolve
from topk_bench.status import Status
from topk_bench.suite import sweep
from topk_bench.suite.checks import check_suite
from topk_bench.suite.load import read_suite
from topk_bench.suite.schema import Suite
from topk_bench.suite.settings import ExecutorSettings, load_settings
from topk_bench.types import DeviceKind, Method
from topk_bench.units import GIB, format_duration

# Where a run's profiles go, under its results directory (``run --profile``, ``topk-bench profile``).
PROFILE_DIR = "profile"
# A new interpreter importing torch (the local template, once; each Slurm task): 2 to 5 s on 2 loaded cores.
INTERPRETER_S = 3.0
# A child forked from the warm template, before it measures (scripts/bench_child_overhead.py: tens of ms).
FORK_S = 0.25
# More rounds than this run only with --yes: each case is measured that many times, its row written after the last.
MAX_ROUNDS = 1000


@dataclass(frozen=True)
class Plan:
    suite: Suite
    settings: RunSettings
    cases: list[Case]
    budget: Budget
    csv_path: Path
    meta_path: Path
    header: list[str]
    notes: list[str]
    # What the machine decides of each implementation's code in this run (implementations.provenance), by name.
    code_paths: dict[str, str] = field(default_factory=dict)

    @property
    def method(self) -> Method:
        return self.settings.method

    @property
    def device(self) -> str:
        return self.settings.device

    @property
    def executor(self) -> ExecutorSettings:
        return self.settings.executor

    @property
    def gpus(self) -> list[str]:
        return list(self.settings.gpus)

    @property
    def rounds(self) -> int:
        return self.settings.rounds


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
    if DeviceKind.of(device) is DeviceKind.CUDA:
        return device_memory_bytes(device), "the device's memory"
    return available_memory_bytes(), "the available memory"


def capped_budget(asked: int, cap: int | None, what: str) -> tuple[int, str | None]:
    """The memory budget in bytes, at most ``cap``, with the note that says so when it was capped."""
    if cap is None or cap >= asked:
        return asked, None
    return cap, f"memory budget capped to {what}, {cap / GIB:.1f} GiB (asked {asked / GIB:g} GiB)"


def plan(
    suite_path: str | Path, flags: Flags | None = None, *, config: str | Path | None = None, yes: bool = False
) -> Plan:
    """The suite's cases and their budget, its settings resolved (bench.toml < suite < ``flags``). Raises
    BadInput; writes nothing.

    A suite of more cases than ``max_cases`` is bad input unless ``yes``, said before its cases are even built.
    """
    settings = load_settings(config)
    suite = read_suite(suite_path)
    run = resolve(settings, suite, flags or Flags())
    memory, capped = capped_budget(int(run.max_memory_gib * GIB), *memory_cap(run.device, run.predicted))
    budget = Budget(memory, run.max_case_seconds)
    cpu_measured = run.measured_on(DeviceKind.CPU)
    count = sweep.count(suite, suite.cpu_max if cpu_measured else None)  # the cases this run will build
    if count > run.max_cases and not yes:
        raise BadInput(
            f"{count} cases, {estimate(count, run.max_case_seconds, run.executor)}: more than "
            f"max_cases = {run.max_cases}; pass --yes to run them, or raise max_cases in the suite or "
            "bench.toml",
            file=suite.path,
            key="max_cases",
        )
    if run.rounds > MAX_ROUNDS and not yes:
        given = flags is not None and flags.rounds is not None
        raise BadInput(
            f"{run.rounds} rounds: more than {MAX_ROUNDS} (each case measured {run.rounds} times, its row written "
            "after its last round); pass --yes to run them",
            file=None if given else suite.path,
            key="--rounds" if given else "rounds",
        )
    check_suite(suite, suite.path)
    cases = sweep.expand(suite, run)
    if run.profile:  # each case writes its profile where `topk-bench profile` would put it
        cases = [replace(c, profile=str(run.out_dir / PROFILE_DIR / c.case_id)) for c in cases]
    code_paths = code_paths_of(cases)
    notes = ([capped] if capped else []) + list(run.notes) + fallback_notes(code_paths)
    if cpu_measured and suite.cpu_max:
        cases, above = within(cases, suite.cpu_max)
        if above:
            limits = ", ".join(f"{k} <= {v}" for k, v in suite.cpu_max.items())
            notes.append(f"cpu_max: {above} case(s) above {limits} left out of this measured CPU run")
    _check_cost_models(cases, suite)
    _check_out_dir(run.out_dir)
    return Plan(
        suite=suite,
        settings=run,
        cases=cases,
        budget=budget,
        csv_path=run.out_dir / f"{suite.name}.csv",
        meta_path=run.out_dir / f"{suite.name}.meta.json",
        header=results_header(parameters_of(cases), optional_columns(suite, cases)),
        notes=notes,
        code_paths=code_paths,
    )


def code_paths_of(cases: list[Case]) -> dict[str, str]:
    """Each implementation's code path for this run (one per name: the run's cases share device and dtype)."""
    paths: dict[str, str] = {}
    for case in cases:
        if case.impl not in paths:
            paths[case.impl] = metadata.code_path(case.impl, case.ff_impl, case.device, case.dtype.to_torch())
    return paths


def fallback_notes(code_paths: dict[str, str]) -> list[str]:
    """One warning per implementation that runs without its compiled kernels here, with the reason: never
    silently."""
    notes = []
    for name, path in code_paths.items():
        for key, value in provenance.parse(path).items():
            if key.endswith(provenance.NATIVE_KERNELS) and value.startswith(provenance.FALLBACK):
                why = value.removeprefix(provenance.FALLBACK)
                notes.append(
                    f"warning: {name} runs torch's path, not its compiled kernels ({why}): its times and peaks "
                    "are the torch path's"
                )  # fmt: skip
    return notes


def _check_cost_models(cases: list[Case], suite: Suite) -> None:
    """Every case's traffic (a plug-in workload's cost model is user code): refused before any file, rather
    than rows the reader rejects or a traceback while writing one."""
    for case in cases:
        try:
            workloads.traffic(case)
        except Exception as exc:  # noqa: BLE001 -- any failure of user code is bad input, in one line
            at = ", ".join(f"{k}={v}" for k, v in case.params if k in suite.sweep)
            raise BadInput(
                f"the {case.workload} workload's traffic(case) at {at} ({case.impl}): {type(exc).__name__}: {exc}",
                file=suite.path,
                key="workload",
            ) from None


def _check_out_dir(out_dir: Path) -> None:
    for place in (out_dir, *out_dir.parents):  # the nearest that exists must be a directory
        if place.exists():
            if not place.is_dir():
                raise BadInput(
                    "expected a directory" + (f", but {place} is a file" if place != out_dir else ""),
                    file=out_dir,
                    key="--out",
                )
            return


def estimate(n: int, seconds: float | None, executor: ExecutorSettings, per_case: float | None = None) -> str:
    """How long ``n`` cases may take: at most every case using its whole time budget; and, with ``per_case``
    (the seconds a case of this file took before, :func:`seconds_per_case`), about ``n`` times that. Without
    history the lower end (the children's start-up alone) says nothing: it is left out."""
    local = executor.kind == "local"
    at_once = executor.jobs if local else executor.array_parallelism
    waves = math.ceil(n / at_once)
    budget = seconds or 0.0
    # Locally one template starts, then each case is a fork; a Slurm task starts an interpreter of its own.
    once, each = (INTERPRETER_S, FORK_S) if local else (0.0, INTERPRETER_S + FORK_S)
    high = (
        f"at most {format_duration(once + waves * (each + budget))} ({at_once} at a time, each within its "
        f"{budget:g} s time budget)"
    )
    if per_case is None:
        return high
    return (
        f"about {format_duration(once + n * max(per_case, each) / at_once)} ({per_case:.3g} s a case here "
        f"before), {high}"
    )


def seconds_per_case(csv_path: Path) -> float | None:
    """The median time between the rows of cases that ran, in the order they were written (each row is written as
    its case ends): what a case of this file took on this machine before; None with fewer than three."""
    try:
        rows = store.read(csv_path).rows
    except BadInput:
        return None
    stamps = sorted(
        filter(
            None,
            (
                _seconds_of(r[col.TIMESTAMP])
                for r in rows
                if r.get(col.STATUS) not in (Status.SKIPPED, Status.UNSUPPORTED)
            ),
        )
    )
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return statistics.median(gaps) if len(gaps) >= 2 else None


def _seconds_of(stamp: str | None) -> float | None:
    """A row's timestamp in seconds; None when it has none, or one that is not a time (a hand-edited cell)."""
    try:
        return datetime.datetime.fromisoformat(stamp).timestamp() if stamp else None
    except ValueError:
        return None


def size_note(the_plan: Plan, todo: int) -> str:
    """The line a run starts with: how many cases, how long (nothing to run: said so, no estimate)."""
    done = len(the_plan.cases) - todo
    name = the_plan.csv_path.name
    if not todo:
        return f"nothing to run: all {done} case{'' if done == 1 else 's'} are in {name}"
    rounds = f", each in {the_plan.rounds} rounds" if the_plan.rounds > 1 else ""
    per_case = seconds_per_case(the_plan.csv_path) if done else None
    return (
        f"{todo} case{'' if todo == 1 else 's'} to run ({done} already in {name}){rounds}, estimate "
        f"{estimate(todo * the_plan.rounds, the_plan.budget.max_seconds, the_plan.executor, per_case)}"
    )


def within(cases: list[Case], limits: dict[str, int]) -> tuple[list[Case], int]:
    """(the cases whose swept sizes are all within ``limits``, how many were above)."""
    kept = [c for c in cases if all(c.param_dict.get(k, c.option_dict.get(k, 0)) <= v for k, v in limits.items())]
    return kept, len(cases) - len(kept)


def parameters_of(cases: list[Case]) -> list[str]:
    """The parameter columns of a run's cases, in the header's order."""
    return order_parameters(name for case in cases for name in parameters(case))


def optional_columns(suite: Suite, cases: list[Case]) -> tuple[str, ...]:
    """The result columns this run fills: the workspace when measured or predicted on CUDA, the unmodelled ops when
    predicted for CUDA, fidelity when the suite asks,
    its workloads' own, and the traffic and rate columns of workloads that state a cost model."""
    cuda = any(c.measured_on(DeviceKind.CUDA) for c in cases)
    cuda_predicted = any(c.predicted and c.device_kind is DeviceKind.CUDA for c in cases)
    own = [c for name in dict.fromkeys(case.workload for case in cases) for c in workloads.lookup(name).columns]
    traffic = {c for case in cases for c in rates.names(workloads.traffic(case))}
    quality = tuple(c for kind in dict.fromkeys(suite.quality) for c in quality_columns(kind))
    compiled = any(not c.predicted and compiles(c) for c in cases)
    return (
        ((col.WORKSPACE_BYTES,) if cuda or cuda_predicted else ())
        + ((col.CUDA_UNMODELED_OPS,) if cuda_predicted else ())
        + ((col.COMPILE_S,) if compiled else ())
        + (col.FIDELITY_COLUMNS if suite.fidelity else ())
        + quality
        + tuple(dict.fromkeys(own))
        + tuple(c for c in rates.COLUMNS if c in traffic)
    )


def meta(the_plan: Plan) -> dict[str, Any]:
    """``<suite>.meta.json``: what ``topk-bench plot`` needs beyond the CSV (docs/CONTRACTS.md)."""
    suite = the_plan.suite
    plot = suite.plot.model_dump()
    plot["x"] = plot["x"] or next(iter(suite.sweep))
    plot["panels"] = [list(p) for p in plot["panels"]]
    return {
        "suite": suite.name,
        # Which suite of that name (its rows carry it too: suite_fingerprint), and the file it was read from.
        "fingerprint": suite.fingerprint,
        "suite_file": str(suite.path) if suite.path else None,
        "title": suite.title,
        "workload": suite.workload,
        "mode": suite.mode,
        "causal": suite.causal,
        "activation": suite.activation,
        "protocol": suite.protocol,
        "sweep": list(suite.sweep),
        "plot": plot,
        # Which columns of the CSV are parameters (a plug-in workload's result columns are not known to readers).
        "parameters": parameters_of(the_plan.cases),
        # The machine-dependent code of each implementation, as this run's parent saw it (each row has its own).
        "code_path": the_plan.code_paths,
    }
