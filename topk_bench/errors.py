"""Errors with a meaning for the harness: bad input and unwritable files (exit code 2), and cases that become
statuses."""

from __future__ import annotations

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
