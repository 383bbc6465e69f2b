"""Running a suite: settings and overrides, budgets, resume, the file lock, the skip-larger rule, the CSV.

Everything that can be wrong with the input is checked in :func:`plan` before
any file is touched. Then :func:`run` takes the suite's lock, writes
``<suite>.meta.json``, and appends one row per case as each ends.
"""

from __future__ import annotations

import collections
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import filelock

import implementations
from topk_bench import sweep
from topk_bench.case import STOPPING_STATUSES, Budget, Case, Measurement
from topk_bench.config import ExecutorSettings, Settings, Suite, load_settings, load_suite
from topk_bench.errors import BadInput
from topk_bench.executors import Executor, get_executor
from topk_bench.progress import Reporter, summary
from topk_bench.results import (FIDELITY_COLUMNS, PRETRAINED_COLUMNS, append_row, columns, make_row, read_rows,
                                remove_rows)

GIB = 2**30
POLL_S = 0.05


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


@dataclass
class RunResult:
    plan: Plan
    written: collections.Counter   # statuses of the rows this run appended
    in_file: collections.Counter   # statuses of every row of this suite's cases in the CSV
    elapsed_s: float

    @property
    def csv_path(self) -> Path:
        return self.plan.csv_path


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


def _check_override(flag: str, value: Any, minimum: float, strict: bool = False) -> None:
    if value is None:
        return
    bad = isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum or (strict and value <= minimum)
    if bad:
        bound = f"> {minimum}" if strict else f">= {minimum}"
        raise BadInput(f"expected a number {bound}, got {value!r}", key=flag)


def _device(requested: str) -> str:
    if requested not in ("auto", "cpu", "cuda"):
        raise BadInput(f"expected auto, cpu or cuda, got {requested!r}", key="--device")
    if requested == "cpu":
        return "cpu"
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if requested == "cuda":
        raise BadInput("no CUDA device is available (torch.cuda.is_available() is False)", key="--device")
    return "cpu"


def plan(suite_path: str | Path, *, config: str | Path | None = None, out: str | Path | None = None,
         device: str | None = None, predict: bool = False, repeats: int | None = None, warmup: int | None = None,
         max_memory_gib: float | None = None, max_case_seconds: float | None = None,
         executor: str | None = None, jobs: int | None = None) -> Plan:
    """Settings (bench.toml < suite < arguments), the cases and their budget. Raises BadInput; writes nothing."""
    _check_override("--repeats", repeats, 1)
    _check_override("--warmup", warmup, 0)
    _check_override("--max-memory", max_memory_gib, 0, strict=True)
    _check_override("--max-case-seconds", max_case_seconds, 0, strict=True)
    _check_override("--jobs", jobs, 1)
    if executor is not None and executor not in ("local", "slurm"):
        raise BadInput(f"expected local or slurm, got {executor!r}", key="--executor")
    settings = load_settings(config)
    suite = load_suite(suite_path)
    notes: list[str] = []

    method = "predicted" if predict else "measured"
    dev = "cpu" if predict else _device(device or settings.device)
    pick = lambda arg, suite_value, default: next(v for v in (arg, suite_value, default) if v is not None)  # noqa: E731
    memory_gib = pick(max_memory_gib, suite.max_memory_gib, settings.max_memory_gib)
    seconds = pick(max_case_seconds, suite.max_case_seconds, settings.max_case_seconds)
    memory = int(memory_gib * GIB)
    if dev == "cpu" and not predict:  # a measured CPU case must not push the machine into swap or the OOM killer
        available = available_memory_bytes()
        if available is not None and available < memory:
            notes.append(f"memory budget capped to the available {available / GIB:.1f} GiB (asked {memory_gib:g} GiB)")
            memory = available
    cases = sweep.expand(
        suite, device=dev, method=method, dtype=pick(None, suite.dtype, settings.dtype),
        warmup=pick(warmup, suite.warmup, settings.warmup), repeats=pick(repeats, suite.repeats, settings.repeats),
    )

    updates: dict[str, Any] = {}
    if executor is not None:
        updates["kind"] = executor
    if jobs is not None:
        updates["jobs"] = jobs
    elif predict and settings.executor.kind == "local":
        # Predicting uses no memory and measures no time: use every core.
        updates["jobs"] = max(settings.executor.jobs, os.cpu_count() or 1)
    # Relative paths of bench.toml are relative to that file, the Slurm log folder too.
    updates["log_dir"] = str(settings.path(settings.executor.log_dir))
    executor_settings = settings.executor.model_copy(update=updates)
    if executor_settings.jobs > 1 and dev == "cpu" and not predict:
        notes.append(f"warning: {executor_settings.jobs} jobs on a measured CPU run compete for cores: "
                     "times are not comparable with a --jobs 1 run")

    out_dir = Path(out) if out is not None else settings.path(settings.results_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise BadInput("expected a directory", file=out_dir, key="--out")
    pretrained = any(c.workload == "pretrained" for c in cases)
    optional = (FIDELITY_COLUMNS if suite.fidelity else ()) + (PRETRAINED_COLUMNS if pretrained else ())
    return Plan(
        suite=suite, settings=settings, cases=cases, budget=Budget(memory, seconds),
        csv_path=out_dir / f"{suite.name}.csv", meta_path=out_dir / f"{suite.name}.meta.json",
        header=columns(sweep.parameter_columns(cases), optional), executor=executor_settings, notes=notes,
    )


def meta(suite: Suite) -> dict[str, Any]:
    """``<suite>.meta.json``: what ``topk-bench plot`` needs beyond the CSV."""
    plot = suite.plot.model_dump()
    plot["x"] = plot["x"] or next(iter(suite.sweep))
    plot["panels"] = [list(p) for p in plot["panels"]]
    return {
        "suite": suite.name, "title": suite.title, "workload": suite.workload, "mode": suite.mode,
        "causal": suite.causal, "activation": suite.activation, "sweep": list(suite.sweep), "plot": plot,
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _defaults(device: str) -> dict[str, str]:
    """torch version, git sha, device name for rows without a measurement (skipped, unsupported)."""
    try:
        from topk_bench import metadata

        return {"torch_version": metadata.torch_version(), "git_sha": metadata.git_sha(),
                "device_name": metadata.device_name(device)}
    except Exception:  # provenance is best effort; a row must still be written
        import torch

        return {"torch_version": torch.__version__}


class _Writer:
    """Appends rows to the suite's CSV and reports them."""

    def __init__(self, plan: Plan, reporter: Reporter):
        self.plan, self.reporter = plan, reporter
        self.header = plan.header
        self.written: collections.Counter = collections.Counter()
        self.keys = list(plan.suite.sweep)
        self.defaults = _defaults(plan.cases[0].device if plan.cases else "cpu")

    def what(self, case: Case) -> str:
        return f"{case.label or case.impl} {sweep.describe_size(case, self.keys)}"

    def write(self, case: Case, measurement: Measurement) -> None:
        row = make_row(case, measurement, sweep.parameters(case), self.defaults)
        self.header = append_row(self.plan.csv_path, row, self.header)
        self.written[measurement.status] += 1
        self.reporter.finished(self.what(case), row)


class _Order:
    """"Larger size of the same implementation" between a run's cases, computed once per case."""

    def __init__(self, cases: list[Case], keys: list[str]):
        self.keys = keys
        self._family = {c.case_id: sweep.family(c, keys) for c in cases}
        self._size = {c.case_id: sweep.size(c, keys) for c in cases}

    def larger(self, case: Case, than: Case) -> bool:
        a, b = self._size[case.case_id], self._size[than.case_id]
        if a == b or self._family[case.case_id] != self._family[than.case_id]:
            return False
        return all(x is not None and y is not None and x >= y for x, y in zip(a, b))


def _schedule(plan: Plan, todo: list[Case], stoppers: list[tuple[Case, str]], executor: Executor,
              writer: _Writer) -> None:
    """Submit cases when no smaller size of their implementation is pending; skip those above a stopper."""
    order = _Order(plan.cases, writer.keys)
    batch = bool(getattr(executor, "prefers_batches", False))  # e.g. Slurm: one array, cancel what is not needed
    waiting = list(todo)
    running: list[tuple[Case, Any]] = []

    def skip_larger(than: Case, status: str) -> None:
        nonlocal waiting
        reason = f"skipped: {than.impl} hit {status} at {sweep.describe_size(than, writer.keys)}"
        for case in [c for c in waiting if order.larger(c, than)]:
            waiting.remove(case)
            writer.write(case, Measurement(status="skipped", error=reason))
        for case, handle in [(c, h) for c, h in running if order.larger(c, than)]:
            if handle.cancel():
                running.remove((case, handle))
                writer.write(case, Measurement(status="skipped", error=reason))

    for stopper, status in stoppers:
        skip_larger(stopper, f"{status} in an earlier run")
    changed = True
    while waiting or running:
        if changed:  # what became ready only changes when a case ends or is skipped
            pending = [c for c, _ in running] + waiting
            ready = waiting if batch else [c for c in waiting if not any(order.larger(c, p) for p in pending)]
            if ready:
                waiting = [c for c in waiting if c not in ready]
                running += list(zip(ready, executor.submit(ready, plan.budget)))
            if running:
                writer.reporter.running(writer.what(running[0][0]))
        finished = [(c, h) for c, h in running if h.done()]
        changed = bool(finished)
        for case, handle in finished:
            if (case, handle) not in running:  # cancelled by an earlier skip in this loop
                continue
            running.remove((case, handle))
            measurement = handle.result()
            writer.write(case, measurement)
            if measurement.status in STOPPING_STATUSES:
                skip_larger(case, measurement.status)
        if not finished:
            time.sleep(POLL_S)


def run(suite_path: str | Path, *, resume: bool = True, progress: bool = True,
        executor_obj: Executor | None = None, **overrides: Any) -> RunResult:
    """Run (or resume) a suite; ``overrides`` are :func:`plan`'s keyword arguments.

    Ctrl-C propagates as ``KeyboardInterrupt`` once the executor is closed; every finished row is on disk.
    """
    started = time.monotonic()
    the_plan = plan(suite_path, **overrides)
    csv_path = the_plan.csv_path
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(csv_path.with_name(f".{csv_path.name}.lock"))
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        raise BadInput("another topk-bench run is writing this file; wait for it or use --out", file=csv_path) from None
    try:
        if not resume and csv_path.exists():  # start this run's cases over; rows of other devices/methods stay
            remove_rows(csv_path, {c.case_id for c in the_plan.cases})
        _write_json(the_plan.meta_path, meta(the_plan.suite))
        existing = {r["case_id"]: r["status"] for r in read_rows(csv_path)}
        todo: list[Case] = []
        stoppers: list[tuple[Case, str]] = []
        for case in the_plan.cases:
            status = existing.get(case.case_id)
            if status is None:
                todo.append(case)
            elif status in STOPPING_STATUSES:
                stoppers.append((case, status))
        reporter = Reporter(the_plan.suite.name, len(the_plan.cases), len(the_plan.cases) - len(todo), enabled=progress)
        with reporter:
            for note in the_plan.notes:
                reporter.note(note)
            writer = _Writer(the_plan, reporter)
            if the_plan.cases and the_plan.cases[0].method == "predicted":
                for case in [c for c in todo if not _predictable(c)]:
                    todo.remove(case)
                    writer.write(case, Measurement(
                        status="unsupported", error=f"{_unpredictable(case)} cannot be predicted "
                        "(data-dependent operations do not run under FakeTensorMode)"))
            if todo:
                executor = executor_obj or get_executor(the_plan.executor)
                try:
                    _schedule(the_plan, todo, stoppers, executor, writer)
                finally:
                    executor.close()
        ids = {c.case_id for c in the_plan.cases}
        in_file = collections.Counter(r["status"] for r in read_rows(csv_path) if r["case_id"] in ids)
        return RunResult(the_plan, writer.written, in_file, time.monotonic() - started)
    finally:
        lock.release()


def _unpredictable(case: Case) -> str | None:
    for name in (case.impl, case.ff_impl):
        if name and not implementations.spec(name).predictable:
            return name
    return None


def _predictable(case: Case) -> bool:
    return _unpredictable(case) is None


def print_summary(result: RunResult) -> None:
    summary(result.plan.suite.name, result.csv_path, result.written, result.in_file, result.elapsed_s)
