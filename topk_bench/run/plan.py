"""A suite planned for running: its settings resolved, its cases expanded, their budget, output paths, header.

Everything that can be wrong with the input is checked here, before any file
is touched. The settings are resolved once (:mod:`.resolve`: bench.toml, then
the suite, then the command line); the plan then only expands the suite into
cases, caps their budget to what the machine has, and names the header.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from topk_bench import fileio, machine, workloads
from topk_bench.attention import provenance
from topk_bench.case import Budget, Case
from topk_bench.errors import BadInput
from topk_bench.measure import metadata
from topk_bench.measure.iterations import compiles
from topk_bench.measure.stages import marks_stages
from topk_bench.results import columns as col
from topk_bench.results import rates
from topk_bench.results.columns import header as results_header
from topk_bench.results.columns import order_parameters, quality_columns
from topk_bench.results.row import parameters
from topk_bench.run import estimate
from topk_bench.run.estimate import Estimate
from topk_bench.run.resolve import Flags, RunSettings, resolve
from topk_bench.suite import overrides, sweep
from topk_bench.suite.checks import check_suite
from topk_bench.suite.load import read_suite
from topk_bench.suite.schema import Suite
from topk_bench.suite.settings import ExecutorSettings, load_settings
from topk_bench.types import DeviceKind, Method
from topk_bench.units import GIB

# Where a run's profiles go, under its results directory (``run --profile``, ``topk-bench profile``).
PROFILE_DIR = "profile"
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
    overrides: dict[str, list[Any]] = field(default_factory=dict)  # --set: key -> the values that replaced the suite's
    # The suite file's own fingerprint, without --set: runs of one file with other --set values share a folder.
    file_fingerprint: str = ""
    # What the machine decides of each implementation's code in this run (topk_bench.attention.provenance), by name
    # and dtype.
    code_paths: dict[str, dict[str, str]] = field(default_factory=dict)

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
    flags = flags or Flags()
    settings = load_settings(config)
    as_written = read_suite(suite_path)
    file_fingerprint = as_written.fingerprint
    suite, replaced = overrides.apply(as_written, flags.overrides)
    run = resolve(settings, suite, flags)
    memory, capped = capped_budget(int(run.max_memory_gib * GIB), *memory_cap(run.device, run.predicted))
    budget = Budget(memory, run.max_case_seconds)
    cpu_measured = run.measured_on(DeviceKind.CPU)
    count = sweep.count(suite, suite.cpu_max if cpu_measured else None)  # the cases this run will build
    if count > run.max_cases and not yes:
        raise BadInput(
            f"{count} cases, {estimate.at_most(count, run.max_case_seconds, run.executor)}: more than "
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
    try:
        check_suite(suite, suite.path)
    except BadInput as exc:  # a value --set gave is the flag's problem, not the file's
        raise overrides.blamed(exc, flags.overrides) from None
    cases = sweep.expand(suite, run)
    if run.profile:  # each case writes its profile where `topk-bench profile` would put it
        cases = [replace(c, profile=str(run.out_dir / PROFILE_DIR / c.case_id)) for c in cases]
    code_paths = code_paths_of(cases)
    cases = expecting_code_paths(cases)
    notes = replaced + ([capped] if capped else []) + list(run.notes) + fallback_notes(code_paths)
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
        overrides=overrides.as_meta(flags.overrides),
        code_paths=code_paths,
        file_fingerprint=file_fingerprint,
    )


def code_paths_of(cases: list[Case]) -> dict[str, dict[str, str]]:
    """Each implementation's code path in this run, by name and dtype (the run's cases share a device). The
    compiled kernels are built here, once for the run (topk_bench.attention.kernels.native.build); their not being used
    is
    said by :func:`fallback_notes`, in one line, not by the library's own warning too."""
    paths: dict[str, dict[str, str]] = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="topk_bench.attention.kernels.native: no compiled kernels")
        for case in cases:
            by_dtype = paths.setdefault(case.impl, {})
            if str(case.dtype) not in by_dtype:
                try:
                    by_dtype[str(case.dtype)] = metadata.code_path(
                        case.impl, case.ff_impl, case.device, case.dtype.to_torch()
                    )
                except ValueError as exc:  # a switch of the implementations' (TOPK_BENCH_TRITON=yes): it names it
                    raise BadInput(str(exc)) from None
    return paths


def expecting_code_paths(cases: list[Case]) -> list[Case]:
    """``cases``, each with the code path found here for its implementations: its child's must be the same
    (topk_bench.child.as_asked), or its row is ``not_as_asked``."""
    found: dict[tuple, str] = {}
    expecting = []
    for case in cases:
        key = (case.impl, case.ff_impl, case.device, case.dtype)
        if key not in found:
            found[key] = metadata.code_path(case.impl, case.ff_impl, case.device, case.dtype.to_torch())
        expecting.append(replace(case, code_path=found[key]))
    return expecting


def fallback_notes(code_paths: dict[str, dict[str, str]]) -> list[str]:
    """One warning per implementation that runs without its compiled kernels here, with the reason: never
    silently."""
    notes = []
    for name, by_dtype in code_paths.items():
        reasons = {
            value.removeprefix(provenance.FALLBACK)
            for path in by_dtype.values()
            for key, value in provenance.parse(path).items()
            if key.endswith(provenance.NATIVE_KERNELS) and value.startswith(provenance.FALLBACK)
        }
        notes += [
            f"warning: {name} runs torch's path, not its compiled kernels ({why}): its times and peaks are the "
            "torch path's"
            for why in sorted(reasons)
        ]
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


def size_note(the_plan: Plan, todo: list[Case], rows: list[dict[str, Any]]) -> tuple[str, Estimate | None]:
    """The line a run starts with: how many cases, how long (nothing to run: said so, no estimate); and the
    estimate (None with nothing to run). ``rows``: the CSV's rows, whose ``wall_s`` say what a case took here
    before."""
    done = len(the_plan.cases) - len(todo)
    name = the_plan.csv_path.name
    if not todo:
        return f"nothing to run: all {done} case{'' if done == 1 else 's'} are in {name}", None
    rounds = f", each in {the_plan.rounds} rounds" if the_plan.rounds > 1 else ""
    guess = estimate.estimate(
        todo,
        the_plan.executor,
        the_plan.budget.max_seconds,
        rounds=the_plan.rounds,
        before=estimate.earlier(rows, this_machine()),
        slower=estimate.slowdown(the_plan.executor, the_plan.settings.threads, machine.busy_now(), machine.cores()),
    )
    return (
        f"{len(todo)} case{'' if len(todo) == 1 else 's'} to run ({done} already in {name}){rounds}, estimate "
        f"{guess.text()}",
        guess,
    )


def this_machine() -> dict[str, str]:
    """The machine columns this machine writes in a row, by which an earlier row is known as this machine's."""
    return {col.CPU_CAPABILITY: metadata.cpu_capability(), col.CPU_FLAGS: metadata.cpu_flags()}


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
    staged = any(marks_stages(c) for c in cases)
    return (
        ((col.WORKSPACE_BYTES,) if cuda or cuda_predicted else ())
        + ((col.CUDA_UNMODELED_OPS,) if cuda_predicted else ())
        + ((col.KERNEL_LAUNCHES,) if cuda or cuda_predicted else ())
        + (col.PREDICTED_TIME_COLUMNS if cuda_predicted else ())
        + ((col.COMPILE_S,) if compiled else ())
        + (col.FIDELITY_COLUMNS if suite.fidelity else ())
        + quality
        + tuple(dict.fromkeys(own))
        + tuple(c for c in rates.COLUMNS if c in traffic)
        + (col.STAGE_COLUMNS if staged else ())
    )


def earlier_meta(the_plan: Plan) -> dict[str, Any]:
    """The folder's meta.json as an earlier run wrote it ({} when there is none or it is not an object)."""
    try:
        found = fileio.read_json(the_plan.meta_path)
    except FileNotFoundError:
        return {}
    except BadInput:
        if not the_plan.meta_path.is_file():  # a FIFO, a device or a folder: the run could not write there either
            raise
        return {}  # an earlier run's file that does not parse: this run writes it anew
    return found if isinstance(found, dict) else {}


def set_runs(the_plan: Plan) -> list[dict[str, Any]]:
    """This run's ``{"fingerprint", "overrides"}`` after those of the earlier runs of the same suite file (same
    ``file_fingerprint``) that wrote to this folder."""
    earlier = earlier_meta(the_plan)
    runs = earlier.get("set_runs") if earlier.get("file_fingerprint") == the_plan.file_fingerprint else None
    ours = {"fingerprint": the_plan.suite.fingerprint, "overrides": the_plan.overrides}
    kept = [r for r in runs if isinstance(r, dict) and r.get("fingerprint") != ours["fingerprint"]] if runs else []
    return [*kept, ours]


def meta(the_plan: Plan) -> dict[str, Any]:
    """``<suite>.meta.json``: what ``topk-bench plot`` needs beyond the CSV (docs/CONTRACTS.md)."""
    suite = the_plan.suite
    plot = suite.plot.model_dump()
    plot["x"] = plot["x"] or next(iter(suite.sweep))
    plot["panels"] = [list(p) for p in plot["panels"]]
    return {
        "suite": suite.name,
        # Which suite of that name (its rows carry it too: suite_fingerprint), and the file it was read from, as it
        # was named: the command that measures its rows again names it.
        "fingerprint": suite.fingerprint,
        "suite_file": str(suite.path) if suite.path is not None else None,
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
        # --set: the values that replaced the suite's for this run (its rows have them).
        "overrides": the_plan.overrides,
        # The suite file's fingerprint without --set, and every run of that file whose rows the CSV holds (its
        # fingerprint and --set values, this one's included): readers name the command that measures a row again.
        "file_fingerprint": the_plan.file_fingerprint,
        "set_runs": set_runs(the_plan),
        # The machine-dependent code of each implementation by dtype, as this run's parent saw it (each row has its
        # own).
        "code_path": the_plan.code_paths,
    }
