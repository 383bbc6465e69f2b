"""One suite file read, validated against its schema, and checked for meaning."""

from __future__ import annotations

from pathlib import Path

from topk_bench.suite.checks import check_suite
from topk_bench.suite.files import read_toml, validate
from topk_bench.suite.schema import Suite


def read_suite(path: str | Path) -> Suite:
    """The suite's keys and types validated, not yet what they mean (:func:`load_suite` checks that too)."""
    path = Path(path)
    suite = validate(Suite, read_toml(path), path)
    suite._path = path
    return suite


def load_suite(path: str | Path) -> Suite:
    """A validated suite (plug-ins imported, defaults filled in); ``BadInput`` for the first problem."""
    suite = read_suite(path)
    check_suite(suite, suite.path)
    return suite
