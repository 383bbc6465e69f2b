"""``compare BASE NEW --pair-by impl,seq_len``: the cases of two runs paired on the columns named, not on their
``case_id``.

A case's id covers every option (``chunk_size``, ``compile``, a plug-in's own), so two runs that differ in one
share no case: an A/B of that option pairs them on what they have in common instead. Each side is keyed by
the values of those columns (and its device and method: a measurement is never paired with a prediction); two
rows of a side with one key are bad input naming the columns that tell them apart. What differs between paired
cases (the columns left out of the key) is said once when every pair differs alike, else in each case's name.
"""

from __future__ import annotations

import collections
import json
from dataclasses import dataclass, field

import pandas as pd

from topk_bench.errors import BadInput, did_you_mean
from topk_bench.results import columns as col
from topk_bench.results.columns import parameter_columns
from topk_bench.units import missing

FLAG = "--pair-by"
SAME = "same parameters"
ALWAYS = (col.DEVICE, col.METHOD)  # part of every key
# Besides the parameter columns, what a case may be paired on (and what may differ between paired cases).
DESCRIBING = (col.IMPL, col.LABEL, col.WORKLOAD, col.MODE)


@dataclass
class Pairing:
    """Both sides keyed by ``by`` (their index: the key, :func:`_keys`), and what differs between paired cases."""

    by: list[str]
    base: pd.DataFrame
    new: pd.DataFrame
    differences: dict[str, str] = field(default_factory=dict)  # key -> "chunk_size 1024 -> 2048"
    common: str = ""  # the difference every pair shares ("" when they differ otherwise)


def parse(text: str) -> list[str]:
    """``impl,seq_len`` -> ``["impl", "seq_len"]``."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise BadInput(f"expected columns, comma-separated (e.g. impl,seq_len), got {text!r}", key=FLAG)
    return list(dict.fromkeys(names))


def _text(value: object) -> str:
    if missing(value):
        return "-"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _keys(frame: pd.DataFrame, by: list[str], side: str, columns: list[str]) -> pd.Series:
    """Each row's key: the JSON text of its values of ``by`` and :data:`ALWAYS` (a tuple, written so that no two
    tuples read alike: joined with ", " the impl ``Y`` and the impl ``sdpa, impl=Y`` were one key)."""
    values = zip(*([_text(v) for v in frame[c].tolist()] for c in by), *(frame[c].astype(str).tolist() for c in ALWAYS))
    keys = pd.Series([json.dumps(list(v), ensure_ascii=False) for v in values], index=frame.index, dtype=object)
    repeated = keys[keys.duplicated(keep=False)]
    if len(repeated):
        rows = frame[keys == repeated.iloc[0]]
        first = rows.iloc[0]
        key = ", ".join([f"{c}={_text(first[c])}" for c in by] + [str(first[c]) for c in ALWAYS])
        apart = [
            c for c in columns if c not in by and c in rows.columns and rows[c].astype(str).nunique(dropna=False) > 1
        ]
        hint = f" (they differ in {', '.join(apart)}: name {'it' if len(apart) == 1 else 'them'} too)" if apart else ""
        raise BadInput(f"{len(rows)} cases of {side} have {key}{hint}", key=FLAG)
    return keys


def pair(base: pd.DataFrame, new: pd.DataFrame, by: list[str]) -> Pairing:
    """Both sides re-indexed by their key on ``by``; BadInput for a column a side lacks or a key a side repeats."""
    columns = [*DESCRIBING, *dict.fromkeys([*parameter_columns(base.columns), *parameter_columns(new.columns)])]
    for name in by:
        if name not in columns:
            raise BadInput(
                f"unknown column {name!r}{did_you_mean(name, columns)} (columns: {', '.join(columns)})", key=FLAG
            )
        lacking = [side for side, frame in (("BASE", base), ("NEW", new)) if name not in frame.columns]
        if lacking:
            has = "NEW" if lacking == ["BASE"] else "BASE"
            raise BadInput(
                f"column {name!r} is not in {' and '.join(lacking)}"
                + (f" (only {has} has it)" if len(lacking) == 1 else "")
                + ": pair by columns both sides have",
                key=FLAG,
            )
    sides = []
    for side, frame in (("BASE", base), ("NEW", new)):
        attrs = frame.attrs
        keyed = frame.set_index(_keys(frame, by, side, columns), drop=False)
        keyed.index.name = None
        keyed.attrs = attrs
        sides.append(keyed)
    paired = Pairing(by, sides[0], sides[1])
    # The label is a legend, which follows the options: the options themselves say what differs.
    shared = [c for c in columns if c in base.columns and c in new.columns and c not in (*by, col.LABEL)]
    for key in sides[1].index.intersection(sides[0].index):
        b, n = sides[0].loc[key], sides[1].loc[key]
        changed = [f"{c} {_text(b[c])} -> {_text(n[c])}" for c in shared if _text(b[c]) != _text(n[c])]
        paired.differences[key] = ", ".join(changed) or SAME
    kinds = set(paired.differences.values())
    paired.common = kinds.pop() if len(kinds) == 1 else ""
    return paired


def lines(paired: Pairing) -> list[str]:
    """What the report says of the pairing."""
    head = f"paired by {', '.join(paired.by)} (and device, method)"
    if not paired.differences:
        return [f"{head}: no pair"]
    if paired.common:
        return [f"{head}: every pair: {paired.common}"]
    kinds = collections.Counter(paired.differences.values())
    ordered = sorted(kinds.items(), key=lambda item: (item[0] == SAME, -item[1], item[0]))  # differences first
    return [f"{head}: " + "; ".join(f"{count} pair(s): {kind}" for kind, count in ordered)]
