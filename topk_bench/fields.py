"""A dataclass's fields held as their annotations say, whatever they were spelled as: the one place where a value
read from JSON, a suite or a command line becomes the member types its class declares.

JSON has no tuples and no enums: a case written by the parent (``Case.to_json``) comes back to its child with
lists for tuples and strings for members, and a ``str`` enum equals its spelling, so nothing but an ``is`` test
(``case.timer is Timer.CUDAGRAPH``) tells them apart. :func:`coerce` walks the field's type annotation instead of
a list of field names that would have to be kept in step with the class: a field added to a dataclass is held as
its annotation says from then on.

What it converts: an :class:`~enum.Enum` from its value (a :class:`~topk_bench.types.Word` through its ``parse``,
which names the known spellings), ``tuple[X, ...]`` and ``tuple[X, Y]`` from any sequence, ``list[X]`` and
``dict[K, V]`` item by item, an ``int`` from an integral float (``1e9`` bytes), ``X | None`` (None stays None).
Anything else (``Any``, ``str``, ``bool``, ``float``) is left as it is: a check of its type would belong to
whoever reads the file, with the file's name to blame.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Sequence
from typing import Any

_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of ``cls`` (``from __future__ import annotations`` keeps them as text), once each."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def coerce_fields(instance: Any) -> None:
    """Set each field of the dataclass ``instance`` to its value coerced to its annotation (frozen ones too)."""
    hints = _hints(type(instance))
    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        held = coerce(hints[f.name], value, f.name)
        if held is not value:
            object.__setattr__(instance, f.name, held)


def coerce(hint: Any, value: Any, name: str) -> Any:
    """``value`` as the annotation ``hint`` of the field ``name`` says (ValueError naming it when it cannot be)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        kinds = [a for a in args if a is not type(None)]
        if len(kinds) == 1:
            return coerce(kinds[0], value, name)
        return value  # a union of several kinds: nothing says which one a spelling is
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        if isinstance(value, hint):
            return value
        parse = getattr(hint, "parse", None)
        if parse is not None:
            return parse(value, name)
        try:
            return hint(value)
        except ValueError:
            known = ", ".join(str(m.value) for m in hint)
            raise ValueError(f"unknown {name} {value!r} (known: {known})") from None
    if origin is tuple and isinstance(value, Sequence) and not isinstance(value, str):
        if len(args) == 2 and args[1] is Ellipsis:
            items = tuple(coerce(args[0], item, name) for item in value)
        elif args and len(args) == len(value):
            items = tuple(coerce(kind, item, name) for kind, item in zip(args, value))
        else:
            items = tuple(value)
        return value if type(value) is tuple and all(a is b for a, b in zip(items, value)) else items
    if origin is list and isinstance(value, Sequence) and not isinstance(value, str):
        items_list = [coerce(args[0], item, name) for item in value] if args else list(value)
        return value if type(value) is list and all(a is b for a, b in zip(items_list, value)) else items_list
    if origin is dict and isinstance(value, dict) and args:
        pairs = [(coerce(args[0], k, name), coerce(args[1], v, name)) for k, v in value.items()]
        same = all(a is k and b is v for (a, b), (k, v) in zip(pairs, value.items()))
        return value if same else dict(pairs)
    if hint is int and isinstance(value, float) and value.is_integer():
        return int(value)
    return value
