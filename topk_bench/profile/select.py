"""``--case KEY=VALUE[,KEY=VALUE...]``: the cases of a suite picked by their parameters.

The keys are what a results row says of a case: ``impl``, ``label``, ``workload``, ``mode`` and its
parameter columns (``seq_len``, ``chunk_size``, ``causal``, ``dtype``...). A value matches as the row
writes it (``16384``, ``true``). An unknown key, or a selector no case matches, is bad input naming the
keys and values that exist.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from topk_bench.case import Case
from topk_bench.errors import BadInput, did_you_mean
from topk_bench.results.row import parameters

KEY = "--case"
_SHOWN = 12  # values listed per key in a message


def parse(text: str) -> dict[str, str]:
    """``impl=vanilla,seq_len=16384`` -> ``{"impl": "vanilla", "seq_len": "16384"}``."""
    wanted: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise BadInput(f"expected KEY=VALUE[,KEY=VALUE...], got {text!r}", key=KEY)
        if key in wanted and wanted[key] != value:
            raise BadInput(f"{key} given twice ({wanted[key]} and {value})", key=KEY)
        wanted[key] = value
    return wanted


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def describe(case: Case) -> dict[str, str]:
    """The selectable keys of a case and its values, as text."""
    keys = {"impl": case.impl, "label": case.label, "workload": case.workload, "mode": str(case.mode)}
    keys.update(parameters(case))
    return {key: _text(value) for key, value in keys.items() if _text(value) != ""}


def _values(cases: Iterable[dict[str, str]], key: str) -> list[str]:
    return list(dict.fromkeys(c[key] for c in cases if key in c))


def _listed(values: list[str], sep: str = ", ") -> str:
    shown = sep.join(values[:_SHOWN])
    return shown + (f", ... ({len(values)} values)" if len(values) > _SHOWN else "")


def _same(given: str, value: str) -> bool:
    return given == value or given.lower() == value.lower() and value in ("true", "false")


def select(cases: list[Case], wanted: dict[str, str], *, suite: str = "") -> list[Case]:
    """The cases whose every ``wanted`` key has the given value; BadInput when a key is unknown or none matches."""
    described = [describe(c) for c in cases]
    keys = list(dict.fromkeys(k for d in described for k in d))
    unknown = [k for k in wanted if k not in keys]
    if unknown:
        known = "; ".join(f"{key} = {_listed(_values(described, key), '|')}" for key in keys)
        guess = did_you_mean(unknown[0], keys)
        raise BadInput(f"unknown key {unknown[0]!r}{guess}; the cases have {known}", file=suite or None, key=KEY)
    chosen = [c for c, d in zip(cases, described) if all(_same(v, d.get(k, "")) for k, v in wanted.items())]
    if chosen:
        return chosen
    why = []
    for key, value in wanted.items():  # a key whose value no case has, among those that match the other keys
        others = [d for d in described if all(_same(v, d.get(k, "")) for k, v in wanted.items() if k != key)]
        values = _values(others, key)
        if others and not any(_same(value, v) for v in values):
            where = "" if len(wanted) == 1 else " where " + ",".join(f"{k}={v}" for k, v in wanted.items() if k != key)
            why.append(f"{key} is one of {_listed(values)}{where}")
    if not why:  # more than one key is off: each key's values over every case
        why = [f"{key} is one of {_listed(_values(described, key))}" for key in wanted]
    given = ",".join(f"{k}={v}" for k, v in wanted.items())
    raise BadInput(f"no case has {given}: " + "; ".join(why), file=suite or None, key=KEY)
