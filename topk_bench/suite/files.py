"""Reading a TOML file into a validated pydantic model; every problem is one ``BadInput`` naming file and key."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import ErrorDetails

from topk_bench import fileio
from topk_bench.errors import BadInput, did_you_mean

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

Model = TypeVar("Model", bound=BaseModel)


class Strict(BaseModel):
    # strict: no "512" -> 512 or true -> 1 coercion; a file says exactly what it means.
    model_config = ConfigDict(extra="forbid", strict=True)


def read_toml(path: Path) -> dict[str, Any]:
    try:
        text = fileio.read_regular(path, fileio.TEXT_LIMIT).decode("utf-8")
    except FileNotFoundError:
        raise BadInput("file not found", file=path) from None
    except IsADirectoryError:
        raise BadInput("expected a TOML file, got a directory", file=path) from None
    except OSError as exc:
        raise BadInput(f"cannot read: {exc.strerror or exc}", file=path) from None
    except UnicodeDecodeError as exc:
        raise BadInput(f"unreadable ({exc.__class__.__name__}: {exc})", file=path) from None
    try:
        return tomllib.loads(text.removeprefix("\ufeff"))  # a byte-order mark some editors write
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"invalid TOML ({exc})", file=path) from None


def validate(model: type[Model], data: dict[str, Any], path: Path) -> Model:
    """``model`` from ``data``, or the first schema error as ``BadInput``."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _bad_input(exc, model, data, path) from None


def _key(loc: tuple, data: dict[str, Any]) -> str:
    """``('impl', 2, 'topk')`` -> ``impl[2] (topk).topk``: the key as a user finds it in the file."""
    parts: list[str] = []
    node: Any = data
    for item in loc:
        if isinstance(item, int):
            name = ""
            if isinstance(node, list) and item < len(node) and isinstance(node[item], dict):
                name = f" ({node[item].get('name')})" if "name" in node[item] else ""
            parts[-1:] = [f"{parts[-1] if parts else ''}[{item}]{name}"]
        elif item in ("function-after", "function-before", "tagged-union", "literal"):  # pydantic internals
            continue
        elif isinstance(node, list) and isinstance(
            item, str
        ):  # a union member's tag: list[int] of list[int] | list[str]
            continue
        else:
            parts.append(str(item))
        try:
            node = node[item]
        except (KeyError, IndexError, TypeError):
            node = None
    return ".".join(parts)


def problem(error: ErrorDetails, fields: list[str] | None = None) -> str:
    """One pydantic error as the words after ``FILE: KEY:``: what was expected, and what was given."""
    kind, msg, value = error["type"], error["msg"], error["input"]
    if kind == "extra_forbidden":
        guess = did_you_mean(error["loc"][-1], fields or ())
        known = f" (expected one of: {', '.join(fields)})" if fields else ""
        return f"unknown key{guess}{known}"
    if kind == "missing":
        return "missing required key"
    if kind == "too_short":
        return f"expected at least {error.get('ctx', {}).get('min_length', 1)} entry, got none"
    if kind == "string_too_long":
        return f"expected at most {error['ctx']['max_length']} characters, got {len(value)}"
    if kind == "value_error":  # our validators say what they expected and what they got
        return "expected " + re.sub(r"^Value error, ", "", msg)
    msg = re.sub(r"^(Input|Value) should (be |have )?", "", msg)
    return f"expected {msg}, got {value!r}"


def _bad_input(exc: ValidationError, model: type[BaseModel], data: dict[str, Any], path: Path) -> BadInput:
    errors = exc.errors()
    # An unknown key first: a misspelt required key ("worklaod") is also a missing one, and the missing one says
    # nothing of the key the file has.
    error = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = tuple(error["loc"])
    # The keys the enclosing table accepts, for "unknown key" errors.
    fields = None
    if error["type"] == "extra_forbidden":
        owner: Any = model
        for item in loc[:-1]:
            info = getattr(owner, "model_fields", {}).get(item) if isinstance(item, str) else None
            owner = info.annotation if info is not None else owner
        if hasattr(owner, "model_fields"):
            fields = list(owner.model_fields)
    return BadInput(problem(error, fields), file=path, key=_key(loc, data) or None)
