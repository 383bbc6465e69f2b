"""What a suite means, checked against its workload and the implementation registry.

The schema (types, unknown keys) is pydantic's job in ``config.py``; this is the
rest: sizes, implementation names, options, activation and masking support —
each failure one ``BadInput`` naming the file and the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import implementations
from topk_bench.config import SHAPE_DEFAULTS, Suite, import_plugins
from topk_bench.errors import BadInput


def _check_size(value: Any, path: Path, key: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInput(f"expected a positive integer, got {value!r}", file=path, key=key)
    if value < 1:
        raise BadInput(f"expected a positive integer, got {value}", file=path, key=key)


def _check_option(default: Any, value: Any, path: Path, key: str) -> None:
    """An option's value has its default's type; integer options (topk, chunk_size, nb_features) are sizes."""
    if default is None:
        return
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise BadInput(f"expected true or false, got {value!r}", file=path, key=key)
    elif isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadInput(f"expected an integer, got {value!r}", file=path, key=key)
        if default > 0 and value < 1:
            raise BadInput(f"expected an integer >= 1, got {value}", file=path, key=key)
        if value < 0:
            raise BadInput(f"expected an integer >= 0, got {value}", file=path, key=key)
    elif isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadInput(f"expected a number, got {value!r}", file=path, key=key)
    elif isinstance(default, str) and not isinstance(value, str):
        raise BadInput(f"expected a string, got {value!r}", file=path, key=key)


def _spec(name: str, path: Path, key: str) -> implementations.Implementation:
    try:
        return implementations.spec(name)
    except implementations.UnknownImplementation as exc:
        raise BadInput(f"{exc}; add it with `plugins = [\"your.module\"]`", file=path, key=key) from None


def _check_options(impl: implementations.Implementation, options: Mapping[str, Any], path: Path, key: str) -> None:
    unknown = sorted(set(options) - set(impl.options))
    if unknown:
        known = ", ".join(sorted(impl.options)) or "none"
        raise BadInput(f"implementation {impl.name!r} has no option {unknown[0]!r} (options: {known})",
                       file=path, key=f"{key}.{unknown[0]}")
    for name, value in options.items():
        _check_option(impl.options[name], value, path, f"{key}.{name}")


def _check_capabilities(impl: implementations.Implementation, activation: str, causal: bool,
                        path: Path, key: str) -> None:
    if activation not in impl.activations:
        raise BadInput(f"implementation {impl.name!r} does not support activation {activation!r} "
                       f"(supports: {', '.join(impl.activations)})", file=path, key=key)
    if causal and not impl.causal:
        raise BadInput(f"implementation {impl.name!r} does not support causal masking", file=path, key=key)


def _params(workload: str) -> tuple[str, ...] | None:
    """Shape parameters of a workload; None: any (the pretrained workload defines its own)."""
    return tuple(SHAPE_DEFAULTS[workload]) if workload in SHAPE_DEFAULTS else None


def _check_workload(workload: str, causal: bool, activation: str, path: Path, key: str) -> None:
    if workload == "ff":
        if causal:
            raise BadInput("the feed-forward workload has no mask: expected causal = false", file=path, key=key)
        if activation != "relu":
            raise BadInput("the feed-forward workload is ReLU(Q Kᵀ) V: expected activation = 'relu'", file=path, key=key)
    if workload == "decoder" and not causal:
        raise BadInput("the decoder is causal: expected causal = true", file=path, key=key)


def _check_shape(suite: Suite, path: Path, workloads: set[str]) -> None:
    known = [_params(w) for w in workloads]
    allowed = None if None in known else sorted({p for ps in known for p in ps})
    for name, value in suite.shape.items():
        if allowed is not None and name not in allowed:
            raise BadInput(f"unknown shape parameter of workload {'/'.join(sorted(workloads))} "
                           f"(expected one of: {', '.join(allowed)})", file=path, key=f"shape.{name}")
        if allowed is not None or isinstance(value, int):
            _check_size(value, path, f"shape.{name}")


def _check_sweep(suite: Suite, path: Path, entries: list[tuple[str, implementations.Implementation]]) -> None:
    for name, values in suite.sweep.items():
        key = f"sweep.{name}"
        if not values:
            raise BadInput("expected a non-empty list of sizes (an empty sweep measures nothing)", file=path, key=key)
        if name in suite.shape:
            raise BadInput("both fixed in [shape] and swept in [sweep]", file=path, key=key)
        for value in values:
            _check_size(value, path, key)
        if len(set(values)) != len(values):
            raise BadInput(f"expected distinct values, got {values}", file=path, key=key)
        # Every entry must vary with every swept key, else its cases would repeat:
        # a shape parameter of its workload, or an option of its implementation (chunk_size in Fig. 2).
        for i, (workload, impl) in enumerate(entries):
            params = _params(workload)
            if params is None or name in params:
                continue
            if name not in impl.options:
                raise BadInput(f"neither a shape parameter of workload {workload!r} ({', '.join(params)}) "
                               f"nor an option of implementation {impl.name!r} (impl[{i}])", file=path, key=key)
            for value in values:
                _check_option(impl.options[name], value, path, key)
            if name in suite.impl[i].options:
                raise BadInput("swept in [sweep] and also set in this [[impl]]", file=path,
                               key=f"impl[{i}] ({impl.name}).{name}")


def _check_heads(suite: Suite, path: Path, workloads: set[str]) -> None:
    """BERT's head split needs d_model divisible by heads, for every combination swept."""
    if not workloads & {"mha", "decoder"}:
        return
    defaults = SHAPE_DEFAULTS["mha"]
    models = suite.sweep.get("d_model") or [suite.shape.get("d_model", defaults["d_model"])]
    heads = suite.sweep.get("heads") or [suite.shape.get("heads", defaults["heads"])]
    for d_model in models:
        for h in heads:
            if d_model % h:
                key = "sweep.heads" if "heads" in suite.sweep else "shape.heads"
                raise BadInput(f"expected d_model ({d_model}) divisible by heads ({h})", file=path, key=key)


def check_suite(suite: Suite, path: Path) -> None:
    suite.plugins = import_plugins(suite.plugins, path)
    _check_workload(suite.workload, bool(suite.causal), str(suite.activation), path,
                    "causal" if suite.workload != "ff" or suite.causal else "activation")

    entries = []
    for i, entry in enumerate(suite.impl):
        key = f"impl[{i}] ({entry.name})"
        workload, causal, activation = suite.entry_settings(entry)
        _check_workload(workload, causal, activation, path, key)
        impl = _spec(entry.name, path, f"{key}.name")
        entries.append((workload, impl))
        _check_capabilities(impl, activation, causal, path, key)
        _check_options(impl, entry.options, path, key)
        if workload not in ("decoder", "pretrained"):
            if entry.feedforward is not None or entry.feedforward_options:
                raise BadInput("feedforward is for the decoder and pretrained workloads only", file=path,
                               key=f"{key}.feedforward")
            continue
        if entry.feedforward_options and entry.feedforward is None:
            raise BadInput("feedforward_options without feedforward", file=path, key=f"{key}.feedforward_options")
        ff = _spec(entry.feedforward or "vanilla", path, f"{key}.feedforward")
        _check_capabilities(ff, "relu", False, path, f"{key}.feedforward")
        _check_options(ff, entry.feedforward_options, path, f"{key}.feedforward_options")

    workloads = {w for w, _ in entries}
    if "pretrained" in workloads:  # its model comes with an optional extra: say so before running anything
        from topk_bench.pretrained import require_extra

        require_extra(path)
    _check_shape(suite, path, workloads)
    _check_sweep(suite, path, entries)
    _check_heads(suite, path, workloads)

    columns = set(suite.sweep) | set(suite.shape)
    for workload, impl in entries:
        columns |= set(SHAPE_DEFAULTS.get(workload, {})) | set(impl.options)
    if suite.plot.x is not None and suite.plot.x not in columns:
        raise BadInput(f"expected a suite parameter (one of: {', '.join(sorted(columns))})", file=path, key="plot.x")
