"""Parent side: one fresh child process per case (fresh allocator, crash isolation), supervised.

Children are forked from a warm template process (:mod:`topk_bench.child.template`)
that has imported torch once, so a case costs a ``fork``, not an interpreter
start-up. A template serves this process for as long as it lives, one per
working directory and environment (what a fresh interpreter would have read at
start-up); it ends when this process ends, killing its children.

``run_isolated`` never raises for a failing case: a time over the budget kills
the child (``timeout``), a signal death is ``crashed``, a worker that exits
without a result is ``error``; everything else (``ok``, ``oom``,
``over_budget``, ``error``, ``unsupported``) comes back from the child as JSON.
It raises ``BadInput`` only when no case could run here: the scratch directory
(TMPDIR) takes no more files.
The template runs in its own session and each child in its own process group,
so a Ctrl-C meant for the parent reaches neither (the parent kills the child on
the way out), and a child dies with the template (``PR_SET_PDEATHSIG``), which
dies with the parent.
"""

from __future__ import annotations

import itertools
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from topk_bench import fileio
from topk_bench.case import Budget, Case, Measurement
from topk_bench.child.leftovers import note as leftovers_note
from topk_bench.errors import BadInput, file_error
from topk_bench.measure import metadata
from topk_bench.status import Status
from topk_bench.types import RESULT_UNWRITTEN, Exited, Kill, Refused, Start, Started, decode, encode

# A child that has not even started its measurement after this long is hung
# (it includes starting the template: importing torch, on a loaded machine).
STARTUP_LIMIT_S = 300.0
# Every wait on the template looks this often whether it can still answer; one stopped (SIGSTOP) this long
# never will: it is killed, and the case it was serving is crashed.
WATCH_S = 0.5
STOPPED_LIMIT_S = 3.0
# A kill the template does not confirm within this long: the parent kills the child and the template itself.
KILL_ANSWER_S = 10.0
_LOG_TAIL_LINES = 5
# Read by OpenMP and MKL when they load, and by torch at start-up.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
# What a child sets for itself (the template runs without them, one template serves every value): the thread
# settings, and the GPU of its job slot, read when CUDA initialises (in the child, after the fork).
CHILD_VARIABLES = (*THREAD_VARIABLES, "CUDA_VISIBLE_DEVICES")
# Variables that change without changing what a child does: pytest names the running test in one, and a
# template per test would cost every test an interpreter importing torch.
VOLATILE_VARIABLES = ("PYTEST_CURRENT_TEST",)

# What measures one case in a process of its own (:func:`run_isolated`, or a test's stand-in).
# (case, budget) -> its measurement; also called with env=... where job slots give their children variables.
CaseRunner = Callable[..., Measurement]

# Templates of other environments kept alive at once (each holds torch's memory, ~0.5 GB).
MAX_TEMPLATES = 2


def torch_threads(env: Mapping[str, str]) -> int | None:
    """The intra-op threads torch takes from ``env`` at start-up (MKL_NUM_THREADS over OMP_NUM_THREADS,
    malformed values ignored, as ATen's ``intraop_default_num_threads``); None: its default."""
    threads = None
    for name in THREAD_VARIABLES:
        try:
            value = int(env.get(name, ""))
        except ValueError:
            continue
        if value > 0:
            threads = value
    return threads


def thread_variables(case: Case) -> dict[str, str]:
    """The case's thread setting as the variables a child sets for itself (None: the environment's)."""
    return {name: str(case.threads) for name in THREAD_VARIABLES} if case.threads else {}


def _child_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = {**os.environ, **(extra or {})}
    # The child imports this checkout's packages even when they are not installed.
    root = str(metadata.PROJECT_ROOT)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def _tail(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[-_LOG_TAIL_LINES:])[-800:]


def _log_tail(path: Path) -> str:
    try:
        return _tail(path.read_text(errors="replace"))
    except OSError:
        return ""


class _Child:
    """One forked worker as the parent sees it: its pid once forked, its exit code once reaped."""

    def __init__(self, request_id: int):
        self.id = request_id
        self.pid: int | None = None
        # When the template said it forked (monotonic): the case's own time starts there, not at the request,
        # which waits for the template's imports before a run's first case.
        self.started_at: float | None = None
        self.returncode: int | None = None
        self.lost = ""  # why no exit code will come (the template failed or died)
        self.leftovers: tuple[str, ...] = ()  # what it left running, killed by the template
        self._ended = threading.Event()

    def end(self, returncode: int | None = None, lost: str = "", leftovers: tuple[str, ...] = ()) -> None:
        self.returncode, self.lost, self.leftovers = returncode, lost, leftovers
        self._ended.set()

    def wait(self, timeout: float | None = None) -> bool:
        """True once the child has ended (or will never report)."""
        return self._ended.wait(timeout)


class Template:
    """A warm template process and the socket to it; thread-safe."""

    def __init__(self, cwd: str, env: Mapping[str, str]):
        parent_end, template_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._log: IO[bytes] = tempfile.TemporaryFile(prefix="topk-bench-template-")
        try:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "topk_bench.child.worker",
                    "--template",
                    str(template_end.fileno()),
                    "--parent-pid",
                    str(os.getpid()),
                ],
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                pass_fds=(template_end.fileno(),),
                start_new_session=True,
                cwd=cwd,
                env={k: v for k, v in env.items() if k not in CHILD_VARIABLES},
            )
        finally:
            template_end.close()
        self._sock = parent_end
        self._send_lock = threading.Lock()
        self._children: dict[int, _Child] = {}
        self._ids = itertools.count()
        self._closed = False
        self._stopped_since: float | None = None
        self.fresh = ""  # why the template starts fresh interpreters instead of forking ("" while it forks)
        threading.Thread(target=self._read, daemon=True, name="topk-bench-template").start()

    @property
    def alive(self) -> bool:
        return not self._closed

    @property
    def busy(self) -> bool:
        return bool(self._children)

    def log_tail(self) -> str:
        try:
            self._log.seek(0)
            return _tail(self._log.read().decode(errors="replace"))
        except (OSError, ValueError):
            return ""

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            message = decode(data)
            child = self._children.get(message.id)
            if child is None:
                continue
            if isinstance(message, Started):
                child.pid, child.started_at = message.pid, time.monotonic()
                if message.fresh and not self.fresh:
                    self.fresh = message.fresh
                    print(
                        f"topk-bench: cases start as fresh interpreters (slower), not forks of the warm template: "
                        f"{self.fresh} (python scripts/trace_template_threads.py names the call that started it)",
                        file=sys.stderr,
                        flush=True,
                    )
            elif isinstance(message, Exited):
                self._children.pop(child.id, None)
                child.end(message.code, leftovers=message.leftovers)
            elif isinstance(message, Refused):
                self._children.pop(child.id, None)
                child.end(lost=f"the template refused to fork: {message.error}")
        self._closed = True
        self.proc.wait()
        code = self.proc.returncode
        why = f"the template process died ({_describe(code)})" + (f": {tail}" if (tail := self.log_tail()) else "")
        for child in list(self._children.values()):
            child.end(lost=why)
        self._children.clear()

    def start(self, argv: list[str], env: Mapping[str, str], ready_fd: int, log_fd: int) -> _Child:
        """Fork a worker running ``python -m topk_bench.child.worker ARGV``; ``env``: its :data:`CHILD_VARIABLES`."""
        child = _Child(next(self._ids))
        self._children[child.id] = child
        settings = {k: v for k, v in env.items() if k in CHILD_VARIABLES}
        message = encode(Start(child.id, tuple(argv), settings, torch_threads(settings)))
        try:
            with self._send_lock:
                socket.send_fds(self._sock, [message], [ready_fd, log_fd])
        except OSError as exc:
            self._children.pop(child.id, None)
            child.end(lost=f"the template process is gone ({exc})")
        if self._closed and not child.wait(0):  # it died before our request: the reader will not see it
            self._children.pop(child.id, None)
            child.end(lost="the template process died" + (f": {tail}" if (tail := self.log_tail()) else ""))
        return child

    def kill(self, child: _Child) -> None:
        """SIGKILL the child's process group, then wait for it to be reaped (or, when the template does not
        answer, :meth:`abandon` it)."""
        if child.wait(0):
            return
        try:
            with self._send_lock:
                self._sock.send(encode(Kill(child.id)))
        except OSError:
            pass  # the template is gone, and its children with it (the reader ends them)
        if not child.wait(KILL_ANSWER_S):
            self.abandon(child, f"the template process did not answer a kill within {KILL_ANSWER_S:g} s")

    def stalled(self) -> str:
        """Why this template will never answer ("" while it may): stopped (``SIGSTOP``) for
        :data:`STOPPED_LIMIT_S`."""
        try:
            with open(f"/proc/{self.proc.pid}/stat", "rb") as stat:
                state = stat.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            return ""  # gone (its reader ends its children), or no procfs
        if state not in (b"T", b"t"):
            self._stopped_since = None
            return ""
        self._stopped_since = self._stopped_since or time.monotonic()
        if time.monotonic() - self._stopped_since < STOPPED_LIMIT_S:
            return ""
        return f"the template process was stopped (SIGSTOP?) for {STOPPED_LIMIT_S:g} s: killed it"

    def abandon(self, child: _Child, why: str) -> None:
        """The template will not answer: kill ``child``'s process group and the template (a stopped process
        dies of SIGKILL too; its other children die with it), and end ``child`` as lost, saying ``why``.
        The child's pid is still its own: only the template could have reaped it."""
        self._closed = True  # no new case for it: template_for starts another
        self._children.pop(child.id, None)
        if child.pid is not None:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.kill()
        child.end(lost=why)

    def close(self) -> None:
        """End the template (it kills any child still running) and wait for it."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the reader thread too (close() alone would not)
        except OSError:
            pass
        self._sock.close()
        self.proc.wait()
        self._log.close()


_templates: dict[tuple, Template] = {}
_templates_lock = threading.Lock()


def _forget_templates() -> None:
    """In a forked copy of this process: its parent's templates answer only the parent. Closing
    the copies of their sockets also keeps a template from outliving the parent because of us."""
    global _templates_lock
    _templates_lock = threading.Lock()  # another thread may have held it at the fork
    for template in _templates.values():
        template._sock.close()
    _templates.clear()


os.register_at_fork(after_in_child=_forget_templates)


def template_for(env: Mapping[str, str]) -> Template:
    """The template of this working directory and environment (:data:`CHILD_VARIABLES` aside), started if needed."""
    cwd = os.getcwd()
    key = (cwd, tuple(sorted((k, v) for k, v in env.items() if k not in CHILD_VARIABLES + VOLATILE_VARIABLES)))
    with _templates_lock:
        template = _templates.get(key)
        if template is not None and template.alive:
            return template
        for other, old in list(_templates.items()):  # a dead one, and idle ones of other environments
            if not old.alive or (len(_templates) >= MAX_TEMPLATES and not old.busy):
                del _templates[other]
                old.close()
        template = _templates[key] = Template(cwd, env)
        return template


def prestart(env: Mapping[str, str] | None = None) -> None:
    """Start the template of this directory and environment now, if none is running: it imports torch
    (seconds) while the caller does something else, e.g. its own imports and planning."""
    template_for(_child_env(env))


def shutdown() -> None:
    """End every template of this process (they also end when it exits)."""
    with _templates_lock:
        for template in _templates.values():
            template.close()
        _templates.clear()


def _describe(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit code {returncode}"


def _readable(fd: int, limit_s: float) -> bool:
    """Whether ``fd`` has something to read (the child's ready byte, or end of file: it exited) within ``limit_s``."""
    readable, _, _ = select.select([fd], [], [], limit_s)
    return bool(readable)


def _watch(template: Template, wait: Callable[[float], bool], limit_s: float | None) -> bool | str:
    """``wait(seconds)`` in steps until it returns True, or False after ``limit_s`` (None: none); a template
    that stalls meanwhile (:meth:`Template.stalled`) ends the wait with why."""
    deadline = None if limit_s is None else time.monotonic() + limit_s
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if wait(WATCH_S if left is None else max(0.0, min(WATCH_S, left))):
            return True
        stalled = template.stalled()
        if stalled:
            return stalled
        if left is not None and left <= WATCH_S:
            return False


def _failure(case: Case, status: Status, error: str) -> Measurement:
    meta = metadata.collect(case.device)
    return Measurement(status=status, error=error, device_name=meta["device_name"], metadata=meta)


def _supervise(template: Template, child: _Child, ready_fd: int, budget: Budget) -> tuple[str, float | None]:
    """Wait for ``child`` to start, then to end within the time budget; (why it was killed or "", start-up
    seconds). Whatever interrupts the wait (Ctrl-C) kills the child first: none outlives the parent's wait."""
    t0 = time.monotonic()
    try:
        ready = _watch(template, lambda seconds: _readable(ready_fd, seconds), STARTUP_LIMIT_S)
        startup_s = time.monotonic() - t0
        if ready is False:
            template.kill(child)
            return f"the worker did not start within {STARTUP_LIMIT_S:g} s", startup_s
        ended = ready if isinstance(ready, str) else _watch(template, child.wait, budget.max_seconds)
        if ended is False:
            template.kill(child)
            return f"killed after the per-case time budget of {budget.max_seconds:g} s", startup_s
        if isinstance(ended, str):  # the template stalled: the case is lost (crashed), saying why
            template.abandon(child, ended)
        return "", startup_s
    except BaseException:
        template.kill(child)
        raise


def _scratch_unwritable(exc: OSError) -> BadInput:
    """A case's scratch files (in TMPDIR) cannot be written: no case is to blame, and every next case would
    fail the same way, so the run stops (exit 2) rather than write rows that resume would keep."""
    return file_error(
        exc,
        "cannot write a case's scratch files",
        file=tempfile.gettempdir(),
        hint="free space there (or set TMPDIR to another place) and run again to resume",
    )


def _outcome(case: Case, child: _Child, result_path: Path, log_path: Path, timed_out: str) -> Measurement:
    """The case's measurement: the child's result, else why there is none (a status); BadInput when the
    child could not write its result because the scratch directory takes nothing more."""
    code = child.returncode
    if timed_out:
        return _failure(case, Status.TIMEOUT, timed_out)
    if result_path.exists():
        return Measurement.from_json(result_path.read_text())
    if code == RESULT_UNWRITTEN and (problem := fileio.unwritable(result_path.parent)) is not None:
        raise _scratch_unwritable(problem)
    if child.lost:
        return _failure(case, Status.CRASHED, child.lost)
    tail = _log_tail(log_path)
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        hint = " (the kernel's OOM killer?)" if name == "SIGKILL" else ""
        return _failure(case, Status.CRASHED, f"worker killed by {name}{hint}" + (f": {tail}" if tail else ""))
    return _failure(case, Status.ERROR, f"worker exited with code {code} and no result" + (f": {tail}" if tail else ""))


def run_isolated(case: Case, budget: Budget | None = None, *, env: Mapping[str, str] | None = None) -> Measurement:
    """Measure ``case`` in a new worker process (``python -m topk_bench.child.worker``, forked from
    the warm template); ``env`` adds variables for the child, and the case's ``threads`` its thread settings.

    The time budget counts from the moment the child has started, so start-up
    does not eat into it. ``metadata`` gains ``child_startup_s`` (from the request to the child's readiness,
    the template's own start-up included) and ``child_wall_s`` (parent-side wall time of the child, from its
    fork to its end: a run's first case does not carry the template's imports).
    """
    budget = budget or Budget()
    child_env = _child_env({**(env or {}), **thread_variables(case)})
    template = template_for(child_env)
    try:
        scratch = tempfile.TemporaryDirectory(prefix="topk-bench-case-")
    except OSError as exc:
        raise _scratch_unwritable(exc) from None
    with scratch as tmp:
        case_path, result_path, log_path = (Path(tmp) / name for name in ("case.json", "result.json", "log.txt"))
        try:
            case_path.write_text(case.to_json())
            log = open(log_path, "wb")
        except OSError as exc:
            raise _scratch_unwritable(exc) from None
        read_fd, write_fd = os.pipe()
        t0 = time.monotonic()
        try:
            with log:
                child = template.start(
                    [str(case_path), str(result_path), "--budget", budget.to_json()], child_env, write_fd, log.fileno()
                )
        finally:
            os.close(write_fd)  # the child (or nobody) holds the write end: end of file when it ends
        try:
            timed_out, startup_s = _supervise(template, child, read_fd, budget)
        finally:
            os.close(read_fd)
        wall_s = time.monotonic() - (child.started_at or t0)
        result = _outcome(case, child, result_path, log_path, timed_out)
    if child.leftovers:  # a case killed before its end could not sweep its own
        note = leftovers_note(list(child.leftovers))
        result.error = f"{result.error}; {note}" if result.error else note
    result.metadata["child_startup_s"] = startup_s
    result.metadata["child_wall_s"] = wall_s
    return result
