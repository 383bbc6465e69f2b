"""Errors with a meaning for the harness: bad input and unwritable files (exit code 2), and cases that become
statuses."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path


class BadInput(Exception):
    """Invalid user input (a suite, a results file, an option), or a file the command cannot read or write.

    ``str()`` is the one line the CLI prints: ``FILE: KEY: PROBLEM``.
    """

    def __init__(self, problem: str, *, file: str | Path | None = None, key: str | None = None):
        self.problem = problem
        self.file = str(file) if file is not None else None
        self.key = key
        super().__init__(str(self))

    def __str__(self) -> str:
        parts = [p for p in (self.file, self.key) if p]
        return ": ".join([*parts, self.problem])


def file_error(
    exc: OSError, doing: str = "", file: str | Path | None = None, hint: str = "", key: str | None = None
) -> BadInput:
    """A filesystem error (a full disk, a read-only place, a directory where a file belongs) as one line:
    ``FILE: DOING: WHY; HINT``, the file being ``file``, else the one the error names."""
    why = exc.strerror or str(exc)
    if exc.filename2 is not None:
        why += f" ({exc.filename} -> {exc.filename2})"
    elif file is not None and exc.filename is not None and str(exc.filename) != str(file):
        why += f" ({exc.filename})"
    text = f"{doing}: {why}" if doing else why
    return BadInput(text + (f"; {hint}" if hint else ""), file=file if file is not None else exc.filename, key=key)


class Unsupported(Exception):
    """The case asks something its implementation or workload does not do (status ``unsupported``)."""


class NonFinite(Exception):
    """The case's numbers are not finite (a NaN or inf output, gradient or error metric: status ``nonfinite``)."""


def did_you_mean(word: object, choices: Iterable[object]) -> str:
    """``"; did you mean 'workload'?"`` when ``word`` is close to one of ``choices`` (difflib), else ``""``: what
    every "unknown name" message adds, for keys, implementations, workloads, options and parameters alike."""
    names = [str(c) for c in choices]
    close = difflib.get_close_matches(str(word), names, n=1, cutoff=0.6)
    if not close and isinstance(word, str):  # a different case (TopK) is no spelling mistake difflib scores high
        close = [n for n in names if n.lower() == word.lower()][:1]
    return f"; did you mean {close[0]!r}?" if close else ""
