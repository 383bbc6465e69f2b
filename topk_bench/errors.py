"""Errors with a meaning for the harness: bad input (exit code 2) and an unsupported case (a status)."""

from __future__ import annotations

from pathlib import Path


class BadInput(Exception):
    """Invalid user input: a suite, a results directory, an option.

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


class Unsupported(Exception):
    """The case asks something its implementation or workload does not do (status ``unsupported``)."""
