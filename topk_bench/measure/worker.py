"""Runs one case and turns every failure into a status: in-process (:func:`execute`) or as a child process.

Child usage::

    python -m topk_bench.measure.worker CASE.json RESULT.json [--budget JSON] [--ready-fd FD] [--parent-pid PID]
    python -m topk_bench.measure.worker --template FD --parent-pid PID

The first measures one case in this process: it imports the case's plugins,
measures, and writes the ``Measurement`` as JSON. It writes one byte to
``--ready-fd`` once started, so that the parent's time budget counts the
measurement, not the start-up. The second is what :mod:`topk_bench.run.launcher`
starts: the warm template (:mod:`.template`), which forks a child per case that
runs the first form's :func:`main` without a new interpreter.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import resource
import signal
import sys
import traceback
from pathlib import Path

import torch

import implementations
from topk_bench import machine, plugins
from topk_bench.case import Budget, Case, Measurement
from topk_bench.errors import NonFinite, Unsupported
from topk_bench.measure import leftovers, metadata, template
from topk_bench.measure.backends import measure
from topk_bench.measure.extras import extra_columns
from topk_bench.measure.memory import OverBudget
from topk_bench.status import Status
from topk_bench.units import GIB
from topk_bench.types import READY, RESULT_UNWRITTEN, DeviceKind, Method, Mode

# Frames not worth naming in an error: torch internals and the tracker that observes every op.
_INTERNAL = (str(Path(torch.__file__).parent), str(Path(__file__).with_name("memory.py")))
# Room above the memory budget for the interpreter, libraries and thread arenas (address-space limit).
_ADDRESS_SPACE_MARGIN = 2 * GIB


def _where(exc: BaseException) -> str:
    """Innermost frame outside torch and the tracker: where the failing call came from."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_INTERNAL)]
    return f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""


# Allocation failures raised as a plain RuntimeError: the CPU allocator, and CUDA libraries whose own
# allocation failed (cuBLAS/cuBLASLt workspaces and handles, cuDNN, cuSOLVER, cuFFT, a raw cudaMalloc).
_ALLOCATION_FAILURE_TEXT = ("can't allocate memory", "CUDA out of memory", "CUDA error: out of memory",
                            "_STATUS_ALLOC_FAILED", "CUFFT_ALLOC_FAILED")


def _is_allocation_failure(exc: BaseException) -> bool:
    candidates = (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None), MemoryError)
    oom_types = tuple(t for t in candidates if t)
    return isinstance(exc, oom_types) or (
        isinstance(exc, RuntimeError) and any(text in str(exc) for text in _ALLOCATION_FAILURE_TEXT))


def budget_limits_allocations(case: Case | None, budget: Budget) -> bool:
    """Whether the child's allocations are capped by the memory budget itself, so that a failed allocation
    means the case needed more than its budget: a measured CPU case (an address-space limit derived from the
    budget, :func:`limit_address_space`). On CUDA the budget is checked against the measured peaks instead
    (:func:`over_budget`), and a failed allocation means the device ran out."""
    return case is not None and budget.max_memory_bytes is not None and case.measured_on(DeviceKind.CPU)


def classify(exc: BaseException, budget: Budget, case: Case | None = None) -> tuple[str, str]:
    """(status, one-line message) of a failed ``case``.

    A failed allocation is ``over_budget`` only where the budget itself made it fail
    (:func:`budget_limits_allocations`); anywhere else (a CUDA device, the machine) it is ``oom``.
    """
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()] or [""]
    # A first line that only announces the next (torch.compile's "backend='inductor' raised:") takes it along.
    first_line = (f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0])[:400]
    message = f"{type(exc).__name__}: {first_line}{_where(exc)}"
    if isinstance(exc, OverBudget):
        return Status.OVER_BUDGET, first_line
    if isinstance(exc, Unsupported):
        return Status.UNSUPPORTED, first_line
    if isinstance(exc, NotImplementedError):  # what this torch (or an implementation on it) cannot do
        return Status.UNSUPPORTED, message
    if isinstance(exc, NonFinite):  # issue 18: a NaN in an optional column (extras)
        return Status.NONFINITE, first_line
    if _is_allocation_failure(exc):
        return (Status.OVER_BUDGET if budget_limits_allocations(case, budget) else Status.OOM), message
    return Status.ERROR, message


def over_budget(result: Measurement, budget: Budget) -> str:
    """Why a measured ``result`` is over its memory budget ("" when it is not): the largest of its peaks,
    allocated and, where there is one (CUDA), reserved (what the process took from the device; the paper's
    figures drop points whose reserved peak passes 30 GiB)."""
    limit = budget.max_memory_bytes
    if limit is None:
        return ""
    peaks = [(name, value) for name, value in (("peak", result.peak_bytes), ("reserved peak", result.reserved_bytes))
             if value is not None and value > limit]
    if not peaks:
        return ""
    name, value = max(peaks, key=lambda item: item[1])
    return f"{name} {value} bytes exceeds the memory budget of {limit} bytes"


def _measuring(case: Case):
    """How ``case`` is measured: by its backend, or, with a profile directory, by the profile's capture (which
    measures the same way and writes the profile; imported only then: it draws figures)."""
    if case.profile:
        from topk_bench.profile.capture import measure as measure_and_profile

        return measure_and_profile
    return measure


def execute(case: Case, budget: Budget | None = None) -> Measurement:
    """Measure ``case`` in this process, then its optional columns; never raises for a failing case.

    The time budget is not enforced here: the caller's process supervisor
    (the launcher, or Slurm's time limit) kills the process.
    """
    budget = budget or Budget()
    start = machine.read()  # the machine's load around the measurement: the row's trust flag
    try:
        plugins.load(case.plugins)
        result = _measuring(case)(case, budget)
        result.metadata.update(machine.context(start, machine.read()))
        # Outside the measured region: fidelity against vanilla, a workload's own columns.
        if result.status == Status.OK:  # issue 18: not for a nonfinite case (its error metrics are NaN)
            result.extra.update(extra_columns(case, budget))
    except Exception as exc:  # noqa: BLE001 -- every failure becomes a status
        status, message = classify(exc, budget, case)
        meta = metadata.collect(case.device)
        result = Measurement(
            status=status, error=message, peak_bytes=getattr(exc, "live_bytes", None),
            device_name=meta["device_name"], metadata={**meta, **machine.context(start, machine.read())},
        )
    problem = over_budget(result, budget) if result.status == Status.OK else ""
    if problem:
        result.status, result.error = Status.OVER_BUDGET, problem
    return result


# -- child process -----------------------------------------------------------

def backward_may_run_before_fork() -> bool:
    """A build without accelerators: the autograd engine's first run starts no thread.

    In a CUDA (or XPU) build it counts the devices, which initialises the driver, and starts
    a thread per device (on an H100: ``cuda00001800007``, ``pt_autograd_0``): a template
    with threads cannot fork, so there its warm-up stays forward-only and each child pays
    its own first backward (about 40 ms of a predicted case here).
    """
    return not torch.backends.cuda.is_built() and not getattr(torch._C, "_has_xpu", False)


@contextlib.contextmanager
def _cuda_asked_of_nobody():
    """``torch.cuda.is_available()`` answered by the build alone while the template warms up.

    ``FakeTensorMode`` asks it on entering, and in a CUDA build every way torch answers it leaves the
    template unable to fork: the driver (``cudaGetDeviceCount``) initialises CUDA; NVML
    (``PYTORCH_NVML_BASED_CUDA_CHECK=1``) starts a thread (an H100 with driver 580: ``cuda00001800007``,
    from ``nvmlInit``); and a "no" (the GPUs hidden) makes ``FakeTensorMode`` ask the CUDA device guard
    for its device count, which initialises the driver. The warm-up predicts on the CPU, where the
    answer changes nothing but that; the children ask torch itself.
    """
    asked = torch.cuda.is_available
    torch.cuda.is_available = lambda: torch.backends.cuda.is_built()
    try:
        yield
    finally:
        torch.cuda.is_available = asked


def _warm_up_case(impl: str) -> Case:
    spec = implementations.spec(impl)
    mode = Mode.FWD_BWD if backward_may_run_before_fork() else Mode.FWD
    return Case.make(suite="warm-up", workload="mha", impl=impl, method=Method.PREDICTED, mode=mode, causal=spec.causal,
                     activation=spec.activations[0], params={"seq_len": 16, "d_model": 16, "heads": 2},
                     warmup=0, repeats=1)


class WarmUp:
    """What the template runs before forking, so that children do not each pay it.

    At start, a tiny prediction: the first one imports torch._dynamo and sympy
    (seconds). Before the first child of each built-in implementation, a tiny
    prediction of it (its own modules: performer-pytorch, its first dispatches).
    Predictions only (forward-only in a CUDA build: :func:`backward_may_run_before_fork`), on the
    CPU: fake tensors touch no CUDA and run no kernel
    (but for the few ops FakeTensorMode runs for real on zeros, which run on one
    thread here). Before the first profiled case (``Case.profile``), matplotlib, which each draws with.
    Plug-ins are never imported here: each child imports its own.
    """

    def __init__(self) -> None:
        self.done: set[str] = set()

    def start(self) -> None:
        self._predict("vanilla")

    def before(self, argv: list[str]) -> None:
        try:
            case = Case.from_json(Path(argv[0]).read_text())
        except Exception:  # noqa: BLE001 -- the child reads the same file and reports the problem
            return
        for impl in (case.impl, case.ff_impl):
            if impl:
                self._predict(impl)
        if case.profile and "matplotlib.pyplot" not in sys.modules:  # each profile draws a figure: import once
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot  # noqa: F401

    def _predict(self, impl: str) -> None:
        """A tiny prediction of ``impl``, once; nothing for a plug-in's or an unpredictable one."""
        if impl in self.done or impl not in implementations.names() or not implementations.spec(impl).predictable:
            return
        self.done.add(impl)
        # One thread: a fake op the tracker cannot size runs for real on zeros (FakeTensorMode's
        # fallback, e.g. torch.sparse), and a parallel region would leave an OpenMP pool behind.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with _cuda_asked_of_nobody():
                result = execute(_warm_up_case(impl))
        finally:
            torch.set_num_threads(threads)
        if result.status != Status.OK:  # costs each child the imports it would have shared, nothing else
            print(f"topk-bench template: warm-up prediction of {impl} failed: {result.error}",
                  file=sys.stderr, flush=True)


def die_with_parent(parent_pid: int | None) -> None:
    """Linux: the kernel kills this child if its parent dies (no orphans burning cores)."""
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)  # the parent died before prctl took effect


def limit_address_space(case: Case, budget: Budget) -> None:
    """Make a CPU allocation far past the budget fail at once instead of swapping the machine."""
    if not budget_limits_allocations(case, budget):
        return
    vm_size = 0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            vm_size = int(line.split()[1]) * 1024
    limit = vm_size + int(budget.max_memory_bytes) + _ADDRESS_SPACE_MARGIN
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


def initialise_device(case: Case) -> None:
    """A measured CUDA case: initialise CUDA (driver, the device's context: seconds on a cold GPU) before
    the ready byte, so that the case's time budget counts its measurement, not CUDA's start. Here, in
    the child: the template never initialises CUDA (it could not fork a child that uses it)."""
    if not case.measured_on(DeviceKind.CUDA):
        return
    try:
        if torch.cuda.is_available():
            torch.cuda.synchronize(torch.device(case.device))  # creates the primary context; allocates nothing
    except Exception:  # noqa: BLE001 -- the measurement meets the same problem and reports it as the case's status
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m topk_bench.measure.worker", description=__doc__.splitlines()[0])
    parser.add_argument("case", type=Path, nargs="?", help="the case, as written by Case.to_json()")
    parser.add_argument("result", type=Path, nargs="?", help="where the Measurement JSON goes")
    parser.add_argument("--budget", default="{}", help="Budget as JSON, e.g. '{\"max_memory_bytes\": 1e9}'")
    parser.add_argument("--ready-fd", type=int, help="file descriptor that receives one byte once started")
    parser.add_argument("--parent-pid", type=int, help="exit at once if the parent is not this process")
    parser.add_argument("--template", type=int, metavar="FD",
                        help="serve as the warm template on the socket FD: fork one worker per request")
    args = parser.parse_args(argv)

    if args.template is not None:
        # Not PR_SET_PDEATHSIG: it fires when the parent *thread* that started us ends. The template
        # ends when its socket reaches end of file instead, i.e. when the parent process is gone.
        if args.parent_pid is not None and os.getppid() != args.parent_pid:
            return 1
        code = template.serve(args.template, run=main, warmer=WarmUp())
        sys.stderr.flush()
        os._exit(code)  # nothing to clean up; an interpreter shutdown could wait on a stray thread
    if args.case is None or args.result is None:
        parser.error("expected CASE and RESULT, or --template FD")
    die_with_parent(args.parent_pid)
    leftovers.become_subreaper()  # whatever the case starts, however detached, stays ours to kill
    case = Case.from_json(args.case.read_text())
    budget = Budget.from_json(args.budget)
    limit_address_space(case, budget)
    initialise_device(case)
    if args.ready_fd is not None:
        os.write(args.ready_fd, READY)
        os.close(args.ready_fd)
    result = execute(case, budget)
    left = leftovers.note(leftovers.sweep())
    if left:
        result.error = f"{result.error}; {left}" if result.error else left
    partial = args.result.with_suffix(".partial")
    try:
        partial.write_text(result.to_json())
        os.replace(partial, args.result)  # the parent never reads half a file
    except OSError as exc:  # e.g. a full TMPDIR: the parent finds out why and stops the run
        partial.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the log is likely on the same full disk
            print(f"topk-bench worker: cannot write the result: {exc}", file=sys.stderr, flush=True)
        return RESULT_UNWRITTEN
    return 0


if __name__ == "__main__":
    sys.exit(main())
