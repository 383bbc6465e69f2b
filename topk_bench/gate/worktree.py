"""The base revision of the time gate, checked out beside this one: which commit, and its temporary worktree.

The worktree lives in a new temporary folder that also holds ``owner.pid``, the gate's process id. It is
removed when the gate ends, by an exception or a termination signal (SIGTERM, SIGHUP: turned into
:class:`Terminated` so that the ``finally`` runs); a gate killed outright (SIGKILL) cannot, so each gate first
removes the worktrees of gates whose owner is no longer alive, and prunes git's administrative entries.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from topk_bench.errors import BadInput

PREFIX = "topk-bench-time-gate-base-"
OWNER = "owner.pid"
GIT_TIMEOUT_S = 120


class Terminated(Exception):
    """The gate received a termination signal: its worktree is removed before it exits."""

    def __init__(self, signum: int):
        super().__init__(f"terminated by signal {signal.Signals(signum).name}")
        self.signum = signum


def git(root: Path, *args: str) -> subprocess.CompletedProcess:
    """``git args`` in ``root``; BadInput when git is not installed."""
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except FileNotFoundError:
        raise BadInput("git is not on PATH: the gate checks the base revision out with git worktree") from None


def repository_root(start: Path) -> Path:
    """The top of the git repository holding ``start``; BadInput when there is none."""
    found = git(start, "rev-parse", "--show-toplevel")
    if found.returncode != 0:
        raise BadInput(f"{start} is not inside a git repository: the gate compares two of its revisions")
    return Path(found.stdout.strip())


def base_revision(root: Path, given: str | None, base_file: Path) -> str:
    """The base commit's full hash: ``given`` (``--base``), else the hash in ``base_file``; BadInput naming the
    file or the flag when it is not a commit of this repository (a shallow clone lacks old ones)."""
    if given is None:
        where = str(base_file.relative_to(root)) if base_file.is_relative_to(root) else str(base_file)
        try:
            words = base_file.read_text().split()
        except OSError as error:
            raise BadInput(f"cannot read it ({error.strerror}): it holds the base commit's hash", file=where) from None
        given = words[0] if words else ""
        kind = {"file": where}
    else:
        kind = {"key": "--base"}
    found = git(root, "rev-parse", "--verify", "--quiet", f"{given}^{{commit}}") if given else None
    if found is None or found.returncode != 0:
        raise BadInput(f"{given!r} is not a commit of this repository (a shallow clone? git fetch --unshallow)", **kind)
    return found.stdout.strip()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale(root: Path) -> list[Path]:
    """Remove the worktrees of earlier gates whose process is gone (killed outright); their paths."""
    listed = git(root, "worktree", "list", "--porcelain")
    removed = []
    for line in listed.stdout.splitlines():
        path = Path(line.removeprefix("worktree ").strip())
        if not line.startswith("worktree ") or not path.parent.name.startswith(PREFIX):
            continue
        try:
            owner = int((path.parent / OWNER).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            owner = 0  # no owner file: made by a gate killed before writing it, or by hand
        if owner and _alive(owner):
            continue
        git(root, "worktree", "remove", "--force", str(path))
        shutil.rmtree(path.parent, ignore_errors=True)
        removed.append(path)
    git(root, "worktree", "prune")
    return removed


@contextlib.contextmanager
def terminations_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`Terminated` while inside (the handlers before are restored after)."""

    def handler(signum, _frame):
        raise Terminated(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def checkout(root: Path, sha: str) -> Iterator[Path]:
    """The base revision in a temporary worktree, removed afterwards (its administrative entry pruned)."""
    parent = Path(tempfile.mkdtemp(prefix=PREFIX))
    (parent / OWNER).write_text(f"{os.getpid()}\n")
    tree = parent / "base"
    try:
        added = git(root, "worktree", "add", "--detach", "--quiet", str(tree), sha)
        if added.returncode != 0:
            last = (added.stderr.strip().splitlines() or ["no message"])[-1]
            raise BadInput(f"cannot check out the base {sha[:12]} in a worktree: {last}")
        yield tree
    finally:
        git(root, "worktree", "remove", "--force", str(tree))
        shutil.rmtree(parent, ignore_errors=True)
        git(root, "worktree", "prune")
