"""``--set KEY=VALUES``: a suite's values replaced for one run, as if the file said them.

A key is one the suite could name itself: a parameter of its workloads (``seq_len``, ``kv_len``, ``model``...),
swept or fixed, or an option of its implementations (``topk``, ``chunk_size``...). Its values replace the suite's:

- a swept key: the sweep's values (``--set seq_len=1024,2048``);
- a parameter not swept: one value is its ``[shape]`` value, several sweep it;
- an option: one value is set in every ``[[impl]]`` whose implementation has it (over the entry's own), several
  sweep it (every entry must have it, as in a suite's ``[sweep]``);
- a setting of every case that an ``[[impl]]`` may also set for itself (``dtype``, ``mode``, ``causal``,
  ``activation``: :data:`SETTINGS`): one value, the suite's and every entry's (``--set dtype=bfloat16`` runs the
  whole suite in bfloat16, a bf16 decode beside an fp32 training step included).

The values are read as TOML's (``16384`` a number, ``true`` a boolean, ``llama-3-8b`` a name), then checked by the
suite's own rules (:mod:`topk_bench.suite.checks`); any problem is bad input naming ``--set`` and the key. What was
replaced is said before the run starts and kept in ``<suite>.meta.json`` (``overrides``).
"""

from __future__ import annotations

import math
import re
import sys
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from topk_bench import attention, plugins, workloads
from topk_bench.errors import BadInput, did_you_mean
from topk_bench.suite.schema import Suite

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

FLAG = "--set"
# The suite's settings of every case that an [[impl]] may override for itself: one value, not swept.
SETTINGS = ("dtype", "mode", "causal", "activation")
Overrides = tuple[tuple[str, tuple[Any, ...]], ...]  # (key, values), in the order given


def _value(text: str, key: str) -> Any:
    """A value as TOML reads it (a number, a boolean, a quoted string), else the text itself (a name)."""
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    if isinstance(value, float) and not math.isfinite(value):
        raise BadInput(f"expected a finite number, got {text!r}", key=f"{FLAG} {key}")
    if isinstance(value, (dict, list)) or not isinstance(value, (int, float, bool, str)):
        raise BadInput(f"expected a number, true, false or a name, got {text!r}", key=f"{FLAG} {key}")
    return value


def parse(given: Iterable[str] | Mapping[str, Any] | None) -> Overrides:
    """``("seq_len=1024,2048", "topk=64")`` (or ``{"seq_len": [1024, 2048], "topk": 64}``) -> the overrides;
    BadInput naming ``--set`` for text that is not ``KEY=VALUE[,VALUE...]`` or a key given twice."""
    if not given:
        return ()
    pairs: list[tuple[str, tuple[Any, ...]]] = []
    if isinstance(given, Mapping):
        for key, values in given.items():
            values = tuple(values) if isinstance(values, (list, tuple)) else (values,)
            if not values:
                raise BadInput("expected at least one value", key=f"{FLAG} {key}")
            pairs.append((str(key), values))
    else:
        for item in given:
            key, sep, text = str(item).partition("=")
            key = key.strip()
            texts = [t.strip() for t in text.split(",")]
            if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) or not all(texts):
                raise BadInput(f"expected KEY=VALUE[,VALUE...], e.g. seq_len=1024,2048, got {item!r}", key=FLAG)
            pairs.append((key, tuple(_value(t, key) for t in texts)))
    keys = [k for k, _ in pairs]
    twice = next((k for k in keys if keys.count(k) > 1), None)
    if twice is not None:
        raise BadInput("given twice: give its values once, comma-separated", key=f"{FLAG} {twice}")
    for key, values in pairs:
        if len(set(map(repr, values))) != len(values):
            raise BadInput(f"expected distinct values, got {list(values)}", key=f"{FLAG} {key}")
    return tuple(pairs)


def keys(suite: Suite) -> tuple[list[str], list[str]]:
    """(the parameters, the options) a suite's ``--set`` may name: its workloads' and its implementations'."""
    params: dict[str, None] = dict.fromkeys([*suite.sweep, *suite.shape])
    options: dict[str, None] = {}
    for entry in suite.impl:
        try:
            spec = workloads.lookup(entry.workload or suite.workload)
            params.update(dict.fromkeys(spec.params))
            options.update(dict.fromkeys(attention.spec(entry.name).options))
        except (workloads.UnknownWorkload, attention.UnknownImplementation):
            continue  # the suite's own checks name it
    return list(params), [o for o in options if o not in params]


def _open(suite: Suite) -> bool:
    """A workload of the suite takes any parameter (the pretrained model's switches)."""
    names = {entry.workload or suite.workload for entry in suite.impl}
    return any(name in workloads.names() and workloads.lookup(name).open_params for name in names)


def apply(suite: Suite, overrides: Overrides) -> tuple[Suite, list[str]]:
    """The suite with ``overrides`` in place of its values (a copy), and one line saying what each replaced."""
    if not overrides:
        return suite, []
    plugins.resolve(suite.plugins, suite.path)  # their workloads and implementations have keys too
    params, options = keys(suite)
    sweep, shape = dict(suite.sweep), dict(suite.shape)
    entries = [entry.model_copy(deep=True) for entry in suite.impl]
    said = []
    settings: dict[str, Any] = {}
    for key, values in overrides:
        many = list(values)
        if key in SETTINGS and key not in params and key not in options:
            settings[key] = _setting(key, many, suite)
            own = sorted({str(getattr(e, key)) for e in entries if getattr(e, key) is not None})
            was = getattr(suite, key)
            said.append(
                f"{key} = {str(was) if was is not None else 'the default'}"
                + (f" (and [[impl]]'s {', '.join(own)})" if own else "")
            )
            for entry in entries:
                setattr(entry, key, None)
        elif key in sweep:
            said.append(f"sweep.{key} = {sweep[key]}")
            sweep[key] = many
        elif key in params or (key not in options and _open(suite)):
            was = f"shape.{key} = {shape.pop(key)!r}" if key in shape else f"{key} (the workload's default)"
            said.append(was)
            if len(many) == 1:
                shape[key] = many[0]
            else:
                sweep[key] = many
        elif key in options:
            having = [e for e in entries if key in attention.spec(e.name).options]
            own = sorted({repr(e.options[key]) for e in having if key in (e.model_extra or {})})
            said.append(
                f"{key} of {', '.join(dict.fromkeys(e.name for e in having))}" + (f" ({', '.join(own)})" if own else "")
            )
            for entry in having:
                if entry.model_extra is not None:
                    entry.model_extra.pop(key, None)
                    if len(many) == 1:
                        entry.model_extra[key] = many[0]
            if len(many) > 1:
                sweep[key] = many
        else:
            choices = [*params, *options]
            raise BadInput(
                f"not a key of this suite{did_you_mean(key, choices)} (its parameters: {', '.join(params)}; "
                f"its implementations' options: {', '.join(options) or 'none'})",
                file=suite.path,
                key=f"{FLAG} {key}",
            )
    title, plot = suite.title, suite.plot.model_copy()
    for key, _ in overrides:  # a size the suite's words name, which this run no longer has
        old = [*(suite.sweep.get(key) or []), *([suite.shape[key]] if key in suite.shape else [])]
        title = relabelled(title, key, old)
        plot.x_label = relabelled(plot.x_label, key, old) if plot.x_label else plot.x_label
    changed = suite.model_copy(
        update={"sweep": sweep, "shape": shape, "impl": entries, "title": title, "plot": plot, **settings}
    )
    changed._path = suite.path
    lines = [f"{FLAG} {k}={','.join(map(_text, v))}: replaces {was}" for (k, v), was in zip(overrides, said)]
    return changed, lines


def _setting(key: str, values: list[Any], suite: Suite) -> Any:
    """The one value of a setting (:data:`SETTINGS`), checked as the suite's own key is."""
    if len(values) != 1:
        raise BadInput(f"takes one value (a setting of every case, not swept), got {len(values)}", key=f"{FLAG} {key}")
    choices = typing.get_args(Suite.model_fields[key].annotation)
    allowed = [a for choice in choices for a in (typing.get_args(choice) or (choice,)) if a is not type(None)]
    value = values[0]
    if bool in allowed and isinstance(value, bool):
        return value
    if value not in allowed:
        words = ", ".join("true, false" if a is bool else str(a) for a in allowed)
        raise BadInput(f"expected one of {words}, got {value!r}", file=suite.path, key=f"{FLAG} {key}")
    return value


def relabelled(text: str, key: str, old: list[Any]) -> str:
    """``text`` with each number of ``old`` (the values ``--set`` replaced, of three digits or more) written as the
    placeholder ``{key}``, which the figure fills with the values drawn: "of 131072 cached" -> "of {kv_len} cached"."""
    for value in old:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 100:
            spelt = "|".join(re.escape(v) for v in (str(value), f"{value:,}"))
            text = re.sub(rf"(?<![\w.,]){'(?:' + spelt + ')'}(?![\w.]|,\d)", "{" + key + "}", text)
    return text


def _text(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def blamed(exc: BadInput, overrides: Overrides) -> BadInput:
    """A problem the suite's checks found in an overridden key, told as the flag's: ``--set KEY``. A rule of
    several keys (``d_model`` divisible by ``heads``) is keyed by one of them: the problem is the flag's when it
    names an overridden key (``--set d_model=65``: "expected d_model (65) divisible by heads (2)"), not the key
    the suite left as it was."""
    for key, _ in overrides:
        pattern = rf"(^(sweep|shape)\.{re.escape(key)}(\[\d+\])?$)|(\)\.{re.escape(key)}$)"
        if exc.key and re.search(pattern, exc.key):
            return BadInput(exc.problem, file=exc.file, key=f"{FLAG} {key}")
    if exc.key and re.match(r"^(sweep|shape)\.", exc.key):
        for key, _ in overrides:
            if re.search(rf"(?<![\w.]){re.escape(key)} \(", exc.problem):
                return BadInput(exc.problem, file=exc.file, key=f"{FLAG} {key}")
    return exc


def as_meta(overrides: Overrides) -> dict[str, list[Any]]:
    """What ``<suite>.meta.json`` keeps of them: key -> values."""
    return {key: list(values) for key, values in overrides}
