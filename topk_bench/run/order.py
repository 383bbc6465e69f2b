"""Sizes of cases and the skip-larger rule: after an ``oom``, ``over_budget`` or ``timeout``, larger sizes
of the same implementation (same options) would fail too, so they are recorded ``skipped`` without running.

"Larger" is a partial order: same family (the case with its swept shape parameters removed), every swept shape
parameter at least as large and one larger; a swept name (a model) must be the same. A swept option of the
implementation (``chunk_size``, ``topk``) is not a size: a case that timed out at ``chunk_size = 256`` says nothing
of ``chunk_size = 1024`` (a larger chunk may well be faster), so the option stays in the family.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from topk_bench.case import Case


def _value(case: Case, key: str) -> Any:
    params = case.param_dict
    return params[key] if key in params else case.option_dict.get(key)


def size(case: Case, keys: list[str]) -> tuple:
    """The case's swept shape parameters (its size), in the suite's sweep order."""
    params = case.param_dict
    return tuple(params[key] for key in keys if key in params)


def family(case: Case, keys: list[str]) -> Case:
    """The case with its swept shape parameters removed: cases of one family differ only in size."""
    return dataclasses.replace(case, params=tuple((k, v) for k, v in case.params if k not in keys), warmup=0, repeats=0)


def _at_least(x: Any, y: Any) -> bool:
    if x is None or y is None:
        return False
    if isinstance(x, str) or isinstance(y, str):  # a name (a model) is not a size: only the same one
        return x == y
    return x >= y


def _larger(a: tuple, b: tuple) -> bool:
    return a != b and all(_at_least(x, y) for x, y in zip(a, b))


def describe_size(case: Case, keys: list[str]) -> str:
    """Every swept value of the case, options included: what a skipped case's reason names."""
    return " ".join(f"{k}={_value(case, k)}" for k in keys)


class Order:
    """ "Larger size of the same implementation" between the cases of a run, each case's size and family computed
    once."""

    def __init__(self, cases: list[Case], keys: list[str]):
        self.keys = keys
        self._family = {c.case_id: family(c, keys) for c in cases}
        self._size = {c.case_id: size(c, keys) for c in cases}

    def larger(self, case: Case, than: Case) -> bool:
        """Same family, every swept value at least as large and one larger."""
        return self._family[case.case_id] == self._family[than.case_id] and _larger(
            self._size[case.case_id], self._size[than.case_id]
        )
