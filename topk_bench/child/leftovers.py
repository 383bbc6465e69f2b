"""Processes a case left behind: kept within reach, found, killed and named.

A case's process group does not hold everything a plug-in may start: a child in a
session of its own (``setsid``) leaves it, and a daemon whose parent exits is
reparented to init. So each case's process is a *child subreaper*
(``PR_SET_CHILD_SUBREAPER``): whatever it starts, however detached, stays among its
descendants, and when the case ends it kills them (:func:`sweep`) and says so in its
row. The template is a subreaper too: what a case killed before its end (a
timeout) left running is reparented to it, and it sweeps its own children that are
no case's.

Linux only (``/proc`` and ``prctl``); elsewhere nothing is found and nothing killed.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from collections.abc import Collection

_PR_SET_CHILD_SUBREAPER = 36
# Rounds of find-and-kill: a process may fork while the previous round kills its parent.
_ROUNDS = 20


def become_subreaper() -> None:
    """Orphaned descendants of this process are reparented to it, not to init."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process (``/proc/PID/stat``: the field after the command's closing paren)."""
    table: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile
        if fields and fields[0] != b"Z":  # a zombie is dead already: only reaping is left
            table[int(entry)] = int(fields[1])
    return table


def descendants(root: int, skip: Collection[int] = ()) -> list[int]:
    """Living descendants of ``root``, parents first; a child in ``skip`` is left out with its own descendants."""
    children: dict[int, list[int]] = {}
    for pid, parent in _parents().items():
        children.setdefault(parent, []).append(pid)
    found, stack = [], [p for p in children.get(root, []) if p not in skip]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def describe(pid: int) -> str:
    """``sleep 300 (pid 1234)``: its command line (or name), shortened."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            text = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        if not text:
            with open(f"/proc/{pid}/comm") as f:
                text = f.read().strip()
    except OSError:
        text = "?"
    return f"{text[:60]} (pid {pid})"


def _wait_dead(pids: list[int], limit_s: float = 2.0) -> None:
    """Until each of ``pids`` has died (a zombie, or gone), for at most ``limit_s``: SIGKILL is asynchronous."""
    deadline = time.monotonic() + limit_s
    waiting = list(pids)
    while waiting and time.monotonic() < deadline:
        waiting = [pid for pid in waiting if _state(pid) not in (None, b"Z")]
        if waiting:
            time.sleep(0.005)


def _state(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _reap_children() -> None:
    """Collect every child of this process that has ended (they are zombies until then)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def sweep(skip: Collection[int] = (), reap: bool = True) -> list[str]:
    """Kill every living descendant of this process (but ``skip``'s subtrees); what they were, in kill order.

    ``reap``: also collect the children that end (a case's process; the template reaps its own in its loop).
    """
    killed: list[str] = []
    for _ in range(_ROUNDS):
        pids = descendants(os.getpid(), skip)
        if not pids:
            break
        for pid in pids:
            name = describe(pid)
            try:
                os.kill(pid, signal.SIGSTOP)  # stopped first, so that none forks while the others die
            except ProcessLookupError:
                continue
            killed.append(name)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _wait_dead(pids)
        if reap:
            _reap_children()
    if reap:
        _reap_children()
    return killed


def note(killed: list[str]) -> str:
    """The words a row carries about them ("" when there were none)."""
    if not killed:
        return ""
    return f"killed {len(killed)} process(es) the case left running: {', '.join(killed[:5])}" + (
        ", ..." if len(killed) > 5 else ""
    )
