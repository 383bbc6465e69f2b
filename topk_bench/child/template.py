"""The warm template: one process that has imported torch once and forks a fresh worker for each case.

A fresh interpreter per case costs seconds (importing torch, then torch._dynamo
and sympy on the first prediction) for a case whose work may take
milliseconds. The template pays that once: it imports and warms up (a tiny
prediction under ``FakeTensorMode``), then forks one child per case. Each child
is still a process of its own (its own allocator and address space, crash
containment, a process group the parent's supervisor kills), and it never
returns into the template's loop: it ends with ``os._exit``.

Fork safety: a process may only be forked while it has one thread and has not
initialised CUDA (forked OpenMP pools and CUDA contexts do not work in the
child). The template runs no parallel region (its warm-up only runs fake
tensors) and never initialises CUDA: ``FakeTensorMode`` asks
``torch.cuda.is_available()``, which by default initialises the CUDA driver
(and a forked child then cannot use CUDA); torch's fork-safe way,
``PYTORCH_NVML_BASED_CUDA_CHECK=1``, asks NVML, which starts a thread of its own
(an H100 with driver 580: ``cuda00001800007``). So the warm-up answers that
question from the build alone (:func:`topk_bench.child.worker._cuda_asked_of_nobody`);
the template still sets the variable, should anything else ask, and each child
restores it as it was. One library starts threads at import:
OpenBLAS (loaded by numpy, which torch imports) starts its pool, and stops it
itself before any fork (``pthread_atfork``), to restart it lazily on its next
use, which in the template never comes. So when the template has more than one
thread, it first forks a child that exits at once, to let such pools stop;
:func:`fork_hazard` then checks before every fork that the template has exactly
one thread and no CUDA, and it refuses to fork otherwise.

Messages (one ``AF_UNIX``/``SOCK_SEQPACKET`` datagram each way, :mod:`topk_bench.types`):

- parent -> template :class:`~topk_bench.types.Start` with two file descriptors: where the
  child writes its ready byte, and its log (stdout and stderr). ``argv`` is the worker's
  command line; ``env`` holds the variables a child sets for itself: its thread settings
  (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, which OpenMP and MKL read when they load), and
  its GPU (``CUDA_VISIBLE_DEVICES``, read when CUDA initialises: in the child, never in the
  template). The template runs without them; each child sets them and
  ``torch.set_num_threads(threads)`` (what torch would have taken from them at start-up;
  None for its default). Every other variable is the template's own (the parent starts a
  template per environment).
- template -> parent :class:`~topk_bench.types.Started` (its pid, and ``fresh``: why it is a
  fresh interpreter, not a fork) or :class:`~topk_bench.types.Refused`; later
  :class:`~topk_bench.types.Exited` with ``subprocess``'s convention (``-SIGNAL``), and the
  processes the child left running that the template killed (it is a child subreaper:
  :mod:`topk_bench.child.leftovers`).
- parent -> template :class:`~topk_bench.types.Kill`: SIGKILL to the child's process group
  (the template is the child's parent: the pid cannot have been reused before it reaps it).
- end of file (the parent closed its end or died): the template kills its
  children and exits. Each child also dies with the template (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import gc
import os
import selectors
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import NoReturn, Protocol

import torch

from topk_bench.child import leftovers
from topk_bench.types import Exited, Kill, Message, Refused, Start, Started, decode, encode

# The worker's main: its command line in, its exit code out.
WorkerMain = Callable[[Sequence[str]], int]
# Larger than any request (the argv of one case: a few paths and a budget).
MAX_MESSAGE = 1 << 16
# torch.cuda.is_available() then asks NVML instead of initialising the CUDA driver ("does not poison fork"), though
# NVML starts a thread: the warm-up itself asks nobody (worker._cuda_asked_of_nobody).
FORK_SAFE_ENVIRONMENT = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}


class Warmer(Protocol):
    """What the template runs to warm itself up (:class:`topk_bench.child.worker.WarmUp`)."""

    def start(self) -> None:
        """Once, before serving."""

    def before(self, argv: list[str]) -> None:
        """Before forking the child that runs ``argv``."""


def thread_count() -> int:
    """Threads of this process as the kernel sees them (OpenMP and native threads included)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # no procfs: only the threads Python knows of
        return threading.active_count()


# Set (to anything but "" or "0") in the environment: every case starts a fresh interpreter, never a fork.
FRESH_INTERPRETER_VARIABLE = "TOPK_BENCH_FRESH_INTERPRETER"


def thread_names() -> list[str]:
    """Names of this process's threads (``/proc/self/task/*/comm``), for the message that says why no fork."""
    try:
        tasks = sorted(os.listdir("/proc/self/task"))
    except OSError:
        return [thread.name for thread in threading.enumerate()]
    names = []
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                names.append(comm.read().strip())
        except OSError:
            names.append("?")
    return names


def fork_hazard() -> str:
    """Why this process must not be forked now ("" when it may); idle pools that stop for a fork stop first."""
    if os.environ.get(FRESH_INTERPRETER_VARIABLE, "") not in ("", "0"):
        return f"{FRESH_INTERPRETER_VARIABLE} is set"
    if thread_count() != 1:
        settle()
    threads = thread_count()
    if threads != 1:
        return f"the template has {threads} threads ({', '.join(thread_names())})"
    if torch.cuda.is_initialized():
        return "the template has initialised CUDA (a forked child cannot use it)"
    return ""


def settle() -> None:
    """Fork a child that exits at once: libraries that stop their idle threads before a fork (OpenBLAS) do so now."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


class Fresh:
    """What a fresh interpreter has after ``import torch`` and the template changes:
    captured before the warm-up, restored in each child.

    The environment: the template sets :data:`FORK_SAFE_ENVIRONMENT`. Random
    state (a plug-in that draws at import would see it): torch seeds its
    generator at import, with a fixed value in older versions (restored here,
    the warm-up having seeded it) and from the OS in newer ones (reseeded here,
    else all children would share one stream); numpy seeds its own from the OS.
    """

    # c10's default_rng_seed_val: torch's seed at import when it is not drawn from the OS.
    FIXED_TORCH_SEED = 67280421310721

    def __init__(self) -> None:
        self.environment = {name: os.environ.get(name) for name in FORK_SAFE_ENVIRONMENT}
        self.torch_rng = torch.random.get_rng_state() if torch.initial_seed() == self.FIXED_TORCH_SEED else None

    def undo_environment(self, environ: MutableMapping[str, str]) -> None:
        """The template's own variables (:data:`FORK_SAFE_ENVIRONMENT`) set back in ``environ`` as they were."""
        for name, value in self.environment.items():
            if value is None:
                environ.pop(name, None)
            else:
                environ[name] = value

    def restore(self) -> None:
        self.undo_environment(os.environ)
        if self.torch_rng is not None:
            torch.random.set_rng_state(self.torch_rng)
        else:
            torch.seed()
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()


def _send(sock: socket.socket, message: Message) -> None:
    try:
        sock.send(encode(message))
    except OSError:  # the parent is gone: the loop sees end of file next
        pass


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1


def _apply_threads(env: Mapping[str, str], threads: int | None) -> None:
    """What a fresh interpreter started with these variables would have done at start-up."""
    os.environ.update(env)
    if threads:
        torch.set_num_threads(threads)


def _child(
    request: Start,
    ready_fd: int,
    log_fd: int,
    template_pid: int,
    template_fds: Sequence[int],
    fresh: Fresh,
    run: WorkerMain,
) -> NoReturn:
    """What a forked child does: become a clean worker process, run the case, exit (never returns)."""
    code = 1
    try:
        os.setpgid(0, 0)  # its own process group, so that a kill reaches any grandchild too
        signal.set_wakeup_fd(-1)
        for fd in template_fds:  # the template's socket and wake-up pipe: only the template may hold them
            os.close(fd)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        fresh.restore()
        _apply_threads(request.env, request.threads)
        argv = [*request.argv, "--ready-fd", str(ready_fd), "--parent-pid", str(template_pid)]
        sys.argv = [sys.argv[0], *argv]
        code = run(argv)
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:  # noqa: BLE001 -- reported in the case's log; the parent reads its tail
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 -- nothing left to report to
                pass
        # Never back into the template's loop; leaked threads and atexit handlers die with the process.
        os._exit(code)


def _spawn_fresh(request: Start, ready_fd: int, log_fd: int, template_pid: int, fresh: Fresh) -> int:
    """Start the worker as a fresh interpreter (``posix_spawn``: exec at once, safe in a threaded process).

    Used when this template must not fork (:func:`fork_hazard`); the worker then
    pays interpreter start-up, as every case did before templates, and is as
    isolated. Its environment is the one a fork would have had.
    """
    env = dict(os.environ)
    fresh.undo_environment(env)
    env.update(request.env)  # thread settings and GPU, read by the new interpreter itself
    os.set_inheritable(ready_fd, True)
    argv = [
        sys.executable,
        "-m",
        "topk_bench.child.worker",
        *request.argv,
        "--ready-fd",
        str(ready_fd),
        "--parent-pid",
        str(template_pid),
    ]
    return os.posix_spawn(
        sys.executable,
        argv,
        env,
        setpgroup=0,
        file_actions=[
            (os.POSIX_SPAWN_DUP2, log_fd, 1),
            (os.POSIX_SPAWN_DUP2, log_fd, 2),
        ],
    )


class Server:
    """The template's life: warm up, then fork one child per :class:`~topk_bench.types.Start` until the parent
    goes away (end of file on the socket), reporting each child's start and exit."""

    def __init__(self, sock_fd: int, run: WorkerMain, warmer: Warmer):
        self.run, self.warmer = run, warmer
        self.fresh = Fresh()
        os.environ.update(FORK_SAFE_ENVIRONMENT)
        warmer.start()
        gc.collect()
        gc.freeze()  # children touch fewer of the template's pages (no copy-on-write by the collector)
        self.sock = socket.socket(fileno=sock_fd)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # the wake-up fd does the work
        signal.set_wakeup_fd(self.wake_w)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.sock, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        self.children: dict[int, int] = {}  # pid -> request id, until reaped
        self.pid = os.getpid()
        leftovers.become_subreaper()  # what a killed case left running comes here, to be killed

    def serve(self) -> int:
        try:
            while True:
                for key, _ in self.selector.select():
                    if key.fileobj is self.sock:
                        if not self._receive():
                            return 0  # the parent is gone
                    else:
                        self._drain_wakeups()
                self._reap()
        finally:
            for pid in self.children:
                self._kill_group(pid)

    def _receive(self) -> bool:
        """Handle one datagram; False at end of file."""
        data, fds, _, _ = socket.recv_fds(self.sock, MAX_MESSAGE, 2)
        if not data:
            return False
        try:
            message = decode(data)
            if isinstance(message, Start):
                self._start(message, fds)
            elif isinstance(message, Kill):
                self._kill(message.id)
        finally:
            for fd in fds:
                os.close(fd)  # the child has its copies
        return True

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self.wake_r, 512):
                pass
        except BlockingIOError:
            pass

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.children:
                request = self.children.pop(pid)
                # Its orphans are ours by now (reparented as it died); our other children are running cases.
                killed = leftovers.sweep(skip=set(self.children), reap=False)
                _send(self.sock, Exited(request, os.waitstatus_to_exitcode(status), tuple(killed)))

    def _start(self, request: Start, fds: list[int]) -> None:
        if len(fds) != 2:
            _send(self.sock, Refused(request.id, f"expected 2 file descriptors, got {len(fds)}"))
            return
        self.warmer.before(list(request.argv))
        gc.freeze()
        hazard = fork_hazard()
        if hazard:  # correct first, fast second: a fresh interpreter costs start-up, never isolation
            try:  # (_receive closes our copies of the two descriptors afterwards)
                pid = _spawn_fresh(request, fds[0], fds[1], self.pid, self.fresh)
            except OSError as exc:
                _send(self.sock, Refused(request.id, f"{hazard}; a fresh interpreter failed to start: {exc}"))
                return
            self.children[pid] = request.id
            _send(self.sock, Started(request.id, pid, fresh=hazard))
            return
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # else the child would write the template's buffered output again
        pid = os.fork()
        if pid == 0:
            own = (self.sock.fileno(), self.wake_r, self.wake_w, self.selector.fileno())
            _child(request, fds[0], fds[1], self.pid, own, self.fresh, self.run)
        try:
            os.setpgid(pid, pid)  # as the child does: whichever runs first, the group exists before a kill
        except OSError:  # the child got there first, or already died
            pass
        self.children[pid] = request.id
        _send(self.sock, Started(request.id, pid))

    def _kill(self, request_id: int) -> None:
        for pid, rid in self.children.items():
            if rid == request_id:
                self._kill_group(pid)

    @staticmethod
    def _kill_group(pid: int) -> None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def serve(sock_fd: int, run: WorkerMain, warmer: Warmer) -> int:
    """Serve as the warm template on the socket ``sock_fd`` until the parent goes away."""
    return Server(sock_fd, run, warmer).serve()
