"""``--case KEY=VALUE[,KEY=VALUE...]``: the cases of a suite picked by their parameters.

The keys are what a results row says of a case: ``impl``, ``label``, ``workload``, ``mode`` and its
parameter columns (``seq_len``, ``chunk_size``, ``causal``, ``dtype``...). A value matches as the row
writes it (``16384``, ``true``). ``--case`` may be given more than once: a case must match all of them.

A value may hold a comma (the built-in labels do: ``Top-k fast (size=32, topk=8)``): quoted, with ``"`` or
``'`` (a quote inside doubled), or as it is when the whole of what follows ``KEY=`` is a value of that key
(``--case 'label=Top-k fast (size=32, topk=8)'``). An unknown key, or a selector no case matches, is bad input
naming the keys and values that exist, and which characters to quote.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from topk_bench.case import Case
from topk_bench.errors import BadInput, did_you_mean
from topk_bench.results.row import parameters

KEY = "--case"
_SHOWN = 12  # values listed per key in a message
_QUOTES = "\"'"
# What a value holding one of these must be quoted for (a comma separates pairs; a quote starts a quoted value).
_TO_QUOTE = ",\"'"
_FORM = "expected KEY=VALUE[,KEY=VALUE...]"


def _pairs(text: str) -> list[tuple[str, str, bool]]:
    """``impl=vanilla,label="a, b"`` -> ``[("impl", "vanilla", False), ("label", "a, b", True)]`` (key, value,
    quoted). A quoted value runs to its closing quote (a doubled quote is one quote inside)."""
    out: list[tuple[str, str, bool]] = []
    i = 0
    while i < len(text):
        key, sep, _ = text[i:].partition("=")
        if not sep or "," in key:
            raise BadInput(f"{_FORM}, got {text!r}", key=KEY)
        i += len(key) + 1
        rest = text[i:].lstrip()
        if rest[:1] and rest[0] in _QUOTES:
            quote, j, value = rest[0], 1, []
            while True:
                end = rest.find(quote, j)
                if end < 0:
                    raise BadInput(
                        f"{_FORM}: the quote {quote} after {key.strip()}= is not closed, got {text!r}", key=KEY
                    )
                value.append(rest[j:end])
                if rest[end + 1 : end + 2] == quote:  # a doubled quote: one quote of the value
                    value.append(quote)
                    j = end + 2
                    continue
                break
            after = rest[end + 1 :]
            if after.strip() and not after.lstrip().startswith(","):
                raise BadInput(f"{_FORM}: text after the closing quote of {key.strip()}, got {text!r}", key=KEY)
            out.append((key.strip(), "".join(value), True))
            i = len(text) - len(after.lstrip()) + 1  # past the comma
        else:
            end = text.find(",", i)
            end = len(text) if end < 0 else end
            out.append((key.strip(), text[i:end].strip(), False))
            i = end + 1
    return out


def parse(text: str | Sequence[str], known: dict[str, set[str]] | None = None) -> dict[str, str]:
    """``impl=vanilla,seq_len=16384`` (or several such, every ``--case``) -> ``{"impl": "vanilla", "seq_len":
    "16384"}``. ``known``: each key's values among the cases: a ``--case KEY=VALUE`` whose whole VALUE, commas
    included, is one of them is that value (not pairs split at its commas)."""
    texts = [text] if isinstance(text, str) else list(text)
    wanted: dict[str, str] = {}
    for item in texts:
        key, sep, whole = item.partition("=")
        if sep and known and whole.strip() in known.get(key.strip(), ()) and whole.strip()[:1] not in _QUOTES:
            pairs = [(key.strip(), whole.strip(), False)]
        else:
            pairs = _pairs(item)
        for key, value, quoted in pairs:
            if not key or (not value and not quoted):
                raise BadInput(f"{_FORM}, got {item!r}", key=KEY)
            if key in wanted and wanted[key] != value:
                raise BadInput(f"{key} given twice ({wanted[key]} and {value})", key=KEY)
            wanted[key] = value
    if not wanted:
        raise BadInput(f"{_FORM}, got {texts!r}", key=KEY)
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


def known_values(cases: Iterable[Case]) -> dict[str, set[str]]:
    """Each selectable key's values among ``cases`` (what :func:`parse` takes whole)."""
    out: dict[str, set[str]] = {}
    for case in cases:
        for key, value in describe(case).items():
            out.setdefault(key, set()).add(value)
    return out


def _values(cases: Iterable[dict[str, str]], key: str) -> list[str]:
    return list(dict.fromkeys(c[key] for c in cases if key in c))


def _listed(values: list[str], sep: str = ", ") -> str:
    shown = sep.join(values[:_SHOWN])
    return shown + (f", ... ({len(values)} values)" if len(values) > _SHOWN else "")


def _same(given: str, value: str) -> bool:
    return given == value or given.lower() == value.lower() and value in ("true", "false")


def _quoting(described: list[dict[str, str]], wanted: dict[str, str]) -> str:
    """How to give a value holding a comma or a quote, when some value of a key asked for holds one: "" else."""
    for key in wanted:
        holding = [v for v in _values(described, key) if any(c in v for c in _TO_QUOTE)]
        if holding:
            example = holding[0].replace('"', '""')
            return (
                f" (a value holding {' or '.join(repr(c) for c in _TO_QUOTE if c in holding[0])} is quoted: "
                f"--case '{key}=\"{example}\"', or given whole in a --case of its own)"
            )
    return ""


def select(cases: list[Case], wanted: dict[str, str], *, suite: str = "") -> list[Case]:
    """The cases whose every ``wanted`` key has the given value; BadInput when a key is unknown or none matches."""
    described = [describe(c) for c in cases]
    keys = list(dict.fromkeys(k for d in described for k in d))
    unknown = [k for k in wanted if k not in keys]
    if unknown:
        known = "; ".join(f"{key} = {_listed(_values(described, key), '|')}" for key in keys)
        guess = did_you_mean(unknown[0], keys)
        raise BadInput(
            f"unknown key {unknown[0]!r}{guess}; the cases have {known}" + _quoting(described, wanted),
            file=suite or None,
            key=KEY,
        )
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
    raise BadInput(f"no case has {given}: " + "; ".join(why) + _quoting(described, wanted), file=suite or None, key=KEY)
