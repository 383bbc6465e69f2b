"""The child process's entry point: one case in this process, its result written as JSON.

Usage::

    python -m topk_bench.child.worker CASE.json RESULT.json [--budget JSON] [--ready-fd FD] [--parent-pid PID]
    python -m topk_bench.child.worker --template FD --parent-pid PID

The first runs one case (:func:`topk_bench.child.execute.execute`: its plugins imported, measured or
predicted, every failure a status) and writes the ``Measurement`` as JSON. It writes one byte to
``--ready-fd`` once started, so that the parent's time budget counts the measurement, not the start-up.
The second is what :mod:`topk_bench.run.launcher` starts: the warm template (:mod:`.template`), which forks
a child per case that runs the first form's :func:`main` without a new interpreter.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import resource
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from topk_bench.case import Budget, Case
from topk_bench.child import leftovers, template
from topk_bench.child.execute import budget_limits_allocations, execute
from topk_bench.child.warmup import WarmUp
from topk_bench.types import READY, RESULT_UNWRITTEN, DeviceKind
from topk_bench.units import GIB

# Room above the memory budget for the interpreter, libraries and thread arenas (address-space limit).
_ADDRESS_SPACE_MARGIN = 2 * GIB


def die_with_parent(parent_pid: int | None) -> None:
    """Linux: the kernel kills this child if its parent dies (no orphans burning cores)."""
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)  # the parent died before prctl took effect


def limit_address_space(case: Case, budget: Budget) -> None:
    """Make a CPU allocation far past the budget fail at once instead of swapping the machine."""
    if not budget_limits_allocations(case, budget) or budget.max_memory_bytes is None:
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m topk_bench.child.worker", description=__doc__.splitlines()[0])
    parser.add_argument("case", type=Path, nargs="?", help="the case, as written by Case.to_json()")
    parser.add_argument("result", type=Path, nargs="?", help="where the Measurement JSON goes")
    parser.add_argument("--budget", default="{}", help="Budget as JSON, e.g. '{\"max_memory_bytes\": 1e9}'")
    parser.add_argument("--ready-fd", type=int, help="file descriptor that receives one byte once started")
    parser.add_argument("--parent-pid", type=int, help="exit at once if the parent is not this process")
    parser.add_argument(
        "--template",
        type=int,
        metavar="FD",
        help="serve as the warm template on the socket FD: fork one worker per request",
    )
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
