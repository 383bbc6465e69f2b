"""Parent side: one fresh child process per case (fresh allocator, crash isolation), supervised.

``run_isolated`` never raises for a failing case: a time over the budget kills
the child (``timeout``), a signal death is ``crashed``, a worker that exits
without a result is ``error``; everything else (``ok``, ``oom``,
``over_budget``, ``error``, ``unsupported``) comes back from the child as JSON.
The child runs in its own session, so a Ctrl-C meant for the parent does not
reach it (the parent kills it on the way out), and dies with the parent
(``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Mapping

from topk_bench.case import Budget, Case, Measurement
from topk_bench.measure import metadata
from topk_bench.status import Status

# A child that has not even started its measurement after this long is hung.
STARTUP_LIMIT_S = 300.0
_LOG_TAIL_LINES = 5


def _child_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = {**os.environ, **(extra or {})}
    # The child imports this checkout's packages even when they are not installed.
    root = str(metadata.PROJECT_ROOT)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole session: also any grandchild
    except ProcessLookupError:
        pass
    proc.wait()


def _log_tail(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-_LOG_TAIL_LINES:])[-800:]


def _wait_ready(fd: int, limit_s: float) -> bool | None:
    """True once the child reports it started; False if it exited first; None after ``limit_s``."""
    readable, _, _ = select.select([fd], [], [], limit_s)
    if not readable:
        return None
    return os.read(fd, 1) == b"r"


def _failure(case: Case, status: str, error: str) -> Measurement:
    meta = metadata.collect(case.device)
    return Measurement(status=status, error=error, device_name=meta["device_name"], metadata=meta)


def run_isolated(case: Case, budget: Budget | None = None, *, env: Mapping[str, str] | None = None) -> Measurement:
    """Measure ``case`` in a new ``python -m topk_bench.measure.worker`` process; ``env`` adds variables for the child.

    The time budget counts from the moment the child has started (imports done), so
    interpreter start-up does not eat into it. ``metadata`` gains ``child_startup_s``
    and ``child_wall_s`` (parent-side wall time of the whole child).
    """
    budget = budget or Budget()
    with tempfile.TemporaryDirectory(prefix="topk-bench-case-") as tmp:
        case_path, result_path, log_path = (Path(tmp) / name for name in ("case.json", "result.json", "log.txt"))
        case_path.write_text(case.to_json())
        read_fd, write_fd = os.pipe()
        t0 = time.monotonic()
        try:
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "topk_bench.measure.worker", str(case_path), str(result_path),
                     "--budget", json.dumps(asdict(budget)), "--ready-fd", str(write_fd),
                     "--parent-pid", str(os.getpid())],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    pass_fds=(write_fd,), start_new_session=True, env=_child_env(env),
                )
        finally:
            os.close(write_fd)
        timed_out = ""
        startup_s = None
        try:
            ready = _wait_ready(read_fd, STARTUP_LIMIT_S)
            startup_s = time.monotonic() - t0
            if ready is None:
                _kill(proc)
                timed_out = f"the worker did not start within {STARTUP_LIMIT_S:g} s"
            else:
                try:
                    proc.wait(timeout=budget.max_seconds)
                except subprocess.TimeoutExpired:
                    _kill(proc)
                    timed_out = f"killed after the per-case time budget of {budget.max_seconds:g} s"
        except BaseException:
            _kill(proc)  # KeyboardInterrupt or the like: no child outlives the parent's wait
            raise
        finally:
            os.close(read_fd)
        wall_s = time.monotonic() - t0

        if timed_out:
            result = _failure(case, Status.TIMEOUT, timed_out)
        elif result_path.exists():
            result = Measurement.from_json(result_path.read_text())
        elif proc.returncode < 0:
            name = signal.Signals(-proc.returncode).name
            hint = " (the kernel's OOM killer?)" if name == "SIGKILL" else ""
            tail = _log_tail(log_path)
            result = _failure(case, Status.CRASHED, f"worker killed by {name}{hint}" + (f": {tail}" if tail else ""))
        else:
            tail = _log_tail(log_path)
            result = _failure(case, Status.ERROR, f"worker exited with code {proc.returncode} and no result"
                              + (f": {tail}" if tail else ""))
    result.metadata["child_startup_s"] = startup_s
    result.metadata["child_wall_s"] = wall_s
    return result
