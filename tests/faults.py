"""Helpers of the fault tests: the CLI called in this process with a scripted executor, a small real disk.

``Cli`` runs ``topk-bench`` through :func:`topk_bench.cli.main` (so a traceback
would reach the test as an exception, and the exit code and the streams are
what a user sees), with every case measured by :class:`runner_fakes.FakeRun`
instead of a child process: a whole run takes milliseconds.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from runner_fakes import FakeRun
from topk_bench.cli import main
from topk_bench.run import runner
from topk_bench.run.executors import LocalExecutor

# The tiny suite: vanilla, d_model 16, 2 heads, forward only, one repeat.
TINY = """
name = "{name}"
workload = "mha"
mode = "fwd"
repeats = 1
warmup = 0
{extra}
[shape]
d_model = 16
heads = 2
[sweep]
seq_len = {sizes}
[[impl]]
name = "vanilla"
{impl_extra}
"""


def tiny_suite(
    directory: Path, name: str = "tiny", sizes=(16, 32), extra: str = "", impl_extra: str = "", file: str | None = None
) -> Path:
    path = directory / f"{file or name}.toml"
    path.write_text(TINY.format(name=name, sizes=list(sizes), extra=extra, impl_extra=impl_extra))
    return path


@dataclass
class Outcome:
    code: int
    out: str
    err: str

    @property
    def error_line(self) -> str:
        """The one line of a failed command (asserts that it is one line, and no traceback)."""
        lines = self.err.strip().splitlines()
        assert "Traceback" not in self.err, self.err
        assert len(lines) == 1 and lines[0].startswith("topk-bench: error: "), self.err
        return lines[0]


class Cli:
    def __init__(self, monkeypatch, capsys, fake: FakeRun | None = None):
        self.fake = fake or FakeRun()
        self.capsys = capsys
        monkeypatch.setattr(runner, "get_executor", lambda settings, **_: LocalExecutor(run=self.fake))

    def __call__(self, *args) -> Outcome:
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out, err = self.capsys.readouterr()
        return Outcome(code, out, err)


def tree(path: Path) -> dict[str, bytes | None]:
    """Every file under ``path`` with its bytes (None for a directory): 'nothing written' is this unchanged."""
    if not path.exists():
        return {}
    return {str(p.relative_to(path)): (p.read_bytes() if p.is_file() else None) for p in sorted(path.rglob("*"))}


def need_root(why: str) -> None:
    if os.geteuid() != 0:
        pytest.skip(f"needs root to mount a tmpfs ({why}); run the tests as root to include it")


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "64k", read_only: bool = False):
    """A real small filesystem at ``path`` (root only): a disk that fills, or one that is read-only."""
    need_root("a full or read-only disk")
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill(directory: Path, leave_bytes: int) -> Path:
    """Fill ``directory``'s filesystem until ``leave_bytes`` (a multiple of its block size) are free."""
    stat = os.statvfs(directory)
    free = stat.f_bavail * stat.f_frsize
    filler = directory / "filler"
    filler.write_bytes(b"\0" * (free - leave_bytes))
    stat = os.statvfs(directory)
    assert stat.f_bavail * stat.f_frsize == leave_bytes
    return filler
