"""What a suite means, checked against the workload specs and the implementation registry.

The schema (types, unknown keys) is pydantic's job in :mod:`.schema`; this is
the rest: workload and implementation names, options, sizes, masking and
activation support, impossible shapes, the plot's axis — each failure one
``BadInput`` naming the file and the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import topk_bench.attention
from topk_bench import plugins, protocol, workloads
from topk_bench.errors import BadInput, did_you_mean
from topk_bench.results.columns import METRICS
from topk_bench.suite import sweep
from topk_bench.suite.schema import Suite
from topk_bench.workloads.support import capability_problem


def _check_size(value: Any, path: Path | None, key: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInput(f"expected a positive integer, got {value!r}", file=path, key=key)
    if value < 1:
        raise BadInput(f"expected a positive integer, got {value}", file=path, key=key)


def _check_param(spec: workloads.WorkloadSpec, name: str, value: Any, path: Path | None, key: str) -> None:
    """A parameter's value: one of its presets' names, a string where the default is one, else a size."""
    if name in spec.presets:
        if value not in spec.presets[name]:
            raise BadInput(f"expected one of: {', '.join(spec.presets[name])}, got {value!r}", file=path, key=key)
    elif isinstance(spec.params.get(name), str):
        if not isinstance(value, str):
            raise BadInput(f"expected a string, got {value!r}", file=path, key=key)
    else:
        _check_size(value, path, key)


def _check_option(default: Any, value: Any, path: Path | None, key: str) -> None:
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


def _unknown(what: str, name: str, known: list[str]) -> str:
    """An unknown registry name: the closest registered one when there is one, else how to register it (it may
    be the user's own), then every registered name."""
    hint = did_you_mean(name, known) or '; add it with `plugins = ["your.module"]`'
    return f"unknown {what} {name!r}{hint} (known: {', '.join(known)})"


def _implementation(name: str, path: Path | None, key: str) -> topk_bench.attention.Implementation:
    try:
        return topk_bench.attention.spec(name)
    except topk_bench.attention.UnknownImplementation:
        raise BadInput(_unknown("implementation", name, topk_bench.attention.names()), file=path, key=key) from None


def _workload(name: str, path: Path | None, key: str) -> workloads.WorkloadSpec:
    try:
        return workloads.lookup(name)
    except workloads.UnknownWorkload:
        raise BadInput(_unknown("workload", name, workloads.names()), file=path, key=key) from None


def _check_options(
    impl: topk_bench.attention.Implementation,
    options: Mapping[str, Any],
    path: Path | None,
    key: str,
    measured_by: protocol.Protocol,
) -> None:
    unknown = sorted(set(options) - set(impl.options))
    if unknown:
        known = ", ".join(sorted(impl.options)) or "none"
        raise BadInput(
            f"implementation {impl.name!r} has no option {unknown[0]!r}{did_you_mean(unknown[0], impl.options)} "
            f"(options: {known})",
            file=path,
            key=f"{key}.{unknown[0]}",
        )
    owned = sorted(set(options) & set(measured_by.owned_options))
    if owned:
        raise BadInput(
            f"protocol {measured_by.name!r} sets the option {owned[0]!r} itself: leave it out, "
            f"or set protocol = {protocol.DEFAULT!r}",
            file=path,
            key=f"{key}.{owned[0]}",
        )
    for name, value in options.items():
        _check_option(impl.options[name], value, path, f"{key}.{name}")


def _check_use(
    impl: topk_bench.attention.Implementation, activation: str, causal: bool, path: Path | None, key: str
) -> None:
    problem = capability_problem(impl, activation, causal)
    if problem:
        raise BadInput(problem, file=path, key=key)


def _check_settings(
    spec: workloads.WorkloadSpec, causal: bool, activation: str, mode: str, path: Path | None, key: str | None = None
) -> None:
    violation = spec.violation(causal, activation, mode)
    if violation:
        setting, problem = violation
        raise BadInput(problem, file=path, key=key or setting)


def _check_entries(
    suite: Suite, path: Path | None
) -> list[tuple[workloads.WorkloadSpec, topk_bench.attention.Implementation]]:
    entries = []
    for i, entry in enumerate(suite.impl):
        key = f"impl[{i}] ({entry.name})"
        spec = _workload(entry.workload or suite.workload, path, f"{key}.workload")
        _, causal, activation = sweep.entry_settings(suite, entry)
        _check_settings(spec, causal, activation, sweep.entry_mode(suite, entry), path, key)
        impl = _implementation(entry.name, path, f"{key}.name")
        entries.append((spec, impl))
        _check_use(impl, activation, causal, path, key)
        _check_options(impl, entry.options, path, key, suite.measured_by)
        if entry.compile_mode is not None and not entry.compile:
            raise BadInput("compile_mode without compile = true", file=path, key=f"{key}.compile_mode")
        if entry.compile and not suite.measured_by.compiles:
            raise BadInput(
                f"protocol {suite.protocol!r} builds a model per timed iteration: nothing compiled once "
                f"would serve the next (compile = true is for protocol {protocol.DEFAULT!r})",
                file=path,
                key=f"{key}.compile",
            )
        if entry.compile and impl.compiles:
            raise BadInput(
                f"{impl.name} compiles itself (torch.compile inside the implementation): compile = true "
                "would compile it twice",
                file=path,
                key=f"{key}.compile",
            )
        if not spec.feedforward:
            if entry.feedforward is not None or entry.feedforward_options:
                with_ff = ", ".join(n for n in workloads.names() if workloads.lookup(n).feedforward)
                raise BadInput(
                    f"the {spec.name} workload has no feed-forward sublayer to replace (workloads with one: {with_ff})",
                    file=path,
                    key=f"{key}.feedforward",
                )
            continue
        if entry.feedforward_options and entry.feedforward is None:
            raise BadInput("feedforward_options without feedforward", file=path, key=f"{key}.feedforward_options")
        ff_name = sweep.feedforward(suite, entry)
        if ff_name is not None:
            ff = _implementation(ff_name, path, f"{key}.feedforward")
            _check_use(ff, "relu", False, path, f"{key}.feedforward")
            _check_options(ff, entry.feedforward_options, path, f"{key}.feedforward_options", suite.measured_by)
    return entries


def _check_shape(suite: Suite, path: Path | None, specs: list[workloads.WorkloadSpec]) -> None:
    open_params = any(s.open_params for s in specs)
    allowed = sorted({p for s in specs for p in s.params})
    for name, value in suite.shape.items():
        if not open_params and name not in allowed:
            raise BadInput(
                f"unknown shape parameter of workload {'/'.join(sorted({s.name for s in specs}))}"
                f"{did_you_mean(name, allowed)} (expected one of: {', '.join(allowed)})",
                file=path,
                key=f"shape.{name}",
            )
        having = [s for s in specs if name in s.params]
        for spec in having:
            _check_param(spec, name, value, path, f"shape.{name}")
        if not having and isinstance(value, int):
            _check_size(value, path, f"shape.{name}")


def _check_presets(suite: Suite, path: Path | None, specs: list[workloads.WorkloadSpec]) -> None:
    """A parameter a preset sets (``model = "llama-3-8b"``: its heads) is not given too: which would win?"""
    given = {**{k: [v] for k, v in suite.shape.items()}, **suite.sweep}
    for spec in specs:
        for name, presets in spec.presets.items():
            for value in given.get(name, [spec.params.get(name)]):
                if not isinstance(value, str):  # presets are named; a number names none
                    continue
                for param in presets.get(value, {}):
                    if param in given:
                        where = "sweep" if param in suite.sweep else "shape"
                        free = [k for k, sets in presets.items() if not sets]
                        how = f"{name} = {free[0]!r}" if free else f"no {name}"
                        raise BadInput(
                            f"also set by {name} = {value!r} (to {presets[value][param]}); "
                            f"to give it yourself, use {how}",
                            file=path,
                            key=f"{where}.{param}",
                        )


def _check_sweep(suite: Suite, path: Path | None, entries) -> None:
    for name, values in suite.sweep.items():
        key = f"sweep.{name}"
        if not values:
            raise BadInput("expected a non-empty list of sizes (an empty sweep measures nothing)", file=path, key=key)
        if name in suite.shape:
            raise BadInput("both fixed in [shape] and swept in [sweep]", file=path, key=key)
        names = not sweep.is_size(values)
        if not names:
            for value in values:
                _check_size(value, path, key)
        if len(set(values)) != len(values):
            raise BadInput(f"expected distinct values, got {values}", file=path, key=key)
        # Every entry must vary with every swept key, else its cases would repeat:
        # a parameter of its workload, or an option of its implementation (chunk_size in Fig. 2).
        for i, (spec, impl) in enumerate(entries):
            if name in spec.params:
                for value in values:
                    _check_param(spec, name, value, path, key)
                continue
            if spec.open_params:
                continue
            if names:
                raise BadInput(
                    f"not a parameter of workload {spec.name!r} that takes names ({', '.join(spec.params)}); "
                    f"implementation options are swept as sizes (impl[{i}])",
                    file=path,
                    key=key,
                )
            if name not in impl.options:
                guess = did_you_mean(name, [*spec.params, *impl.options])
                raise BadInput(
                    f"neither a shape parameter of workload {spec.name!r} ({', '.join(spec.params)}) "
                    f"nor an option of implementation {impl.name!r} (impl[{i}]){guess}",
                    file=path,
                    key=key,
                )
            for value in values:
                _check_option(impl.options[name], value, path, key)
            if name in suite.impl[i].options:
                raise BadInput(
                    "swept in [sweep] and also set in this [[impl]]", file=path, key=f"impl[{i}] ({impl.name}).{name}"
                )


def _check_combinations(suite: Suite, path: Path | None) -> None:
    """Each workload's rule on its parameters (d_model divisible by heads), at every point of the grid."""
    for entry in suite.impl:
        spec = workloads.lookup(entry.workload or suite.workload)
        if spec.check_params is None:
            continue
        for point in sweep.grid(suite):
            params, _, _ = sweep.route(suite, entry, point)
            problem = spec.check_params({**spec.params, **params})
            if problem:
                param, message = problem
                raise BadInput(message, file=path, key=f"sweep.{param}" if param in suite.sweep else f"shape.{param}")


def _check_cpu_max(suite: Suite, path: Path | None) -> None:
    for name, value in suite.cpu_max.items():
        if name not in suite.sweep or not sweep.is_size(suite.sweep[name]):
            sizes = [k for k, v in suite.sweep.items() if sweep.is_size(v)]
            raise BadInput(f"expected a swept size (one of: {', '.join(sizes)})", file=path, key=f"cpu_max.{name}")
        _check_size(value, path, f"cpu_max.{name}")


def _check_plot(suite: Suite, path: Path | None, entries) -> None:
    columns = set(suite.sweep) | set(suite.shape)
    for spec, impl in entries:
        columns |= set(spec.params) | set(impl.options)
    if suite.plot.x is not None and suite.plot.x not in columns:
        raise BadInput(f"expected a suite parameter (one of: {', '.join(sorted(columns))})", file=path, key="plot.x")
    for i, name in enumerate(suite.plot.split):
        if name not in columns or name == (suite.plot.x or next(iter(suite.sweep))):
            raise BadInput(
                f"expected a suite parameter other than the x axis (one of: {', '.join(sorted(columns))})",
                file=path,
                key=f"plot.split[{i}]",
            )
    for i, name in enumerate(suite.plot.metrics):
        if name not in METRICS:
            raise BadInput(
                f"expected a metric (one of: {', '.join(METRICS)}), got {name!r}", file=path, key=f"plot.metrics[{i}]"
            )


def _check_protocol(suite: Suite, path: Path | None, specs: list[workloads.WorkloadSpec]) -> None:
    """The workloads build their layers the protocol's way, and the suite leaves what it fixes alone."""
    for spec in specs:
        if suite.protocol not in spec.protocols:
            follow = ", ".join(n for n in workloads.names() if suite.protocol in workloads.lookup(n).protocols)
            raise BadInput(
                f"the {spec.name} workload does not follow protocol {suite.protocol!r} (workloads that do: {follow})",
                file=path,
                key="protocol",
            )
    for setting in ("warmup", "repeats", "warmup_s", "min_sample_s", "timer", "flush_l2"):
        problem = suite.measured_by.fixed_value_problem(setting, getattr(suite, setting))
        if problem:
            raise BadInput(problem, file=path, key=setting)
    for name in suite.sweep:
        if name in suite.measured_by.owned_options:
            raise BadInput(
                f"protocol {suite.protocol!r} sets the option {name!r} itself: it cannot be swept",
                file=path,
                key=f"sweep.{name}",
            )


def _check_quality(suite: Suite, path: Path | None, entries) -> None:
    if not suite.quality:
        return
    if suite.fidelity:
        raise BadInput(
            "quality and fidelity = true: ask for one of them (quality judges the attention call against "
            "float64 exact attention, fidelity the layer against vanilla's)",
            file=path,
            key="quality",
        )
    lacking = sorted({s.name for s, _ in entries if s.attention_inputs is None})
    if lacking:
        raise BadInput(
            f"selection quality needs a workload with one attention call (prefill, decode), not {', '.join(lacking)}",
            file=path,
            key="quality",
        )
    if "minilm" in suite.quality:
        from topk_bench.workloads.pretrained.model import missing_extra

        problem = missing_extra()
        if problem:
            raise BadInput(f"quality 'minilm' {problem}", file=path, key="quality")


def _check_fidelity(suite: Suite, path: Path | None, entries) -> None:
    """``fidelity = true`` compares the layer with vanilla's on the workload's random inputs, whose attention has
    no peaked rows: a selection method keeps a fraction of nearly equal weights, and its error at any one budget is
    near 1 for every method, a number that says nothing. What it can say is how the error falls as the budget
    grows (suites/fidelity.toml sweeps ``topk`` up to the length): a selection method's budget must be swept."""
    if not suite.fidelity:
        return
    for i, (_, impl) in enumerate(entries):
        if impl.selection is None or set(impl.options) & set(suite.sweep):
            continue
        raise BadInput(
            f"fidelity = true with {impl.name} at one budget: on random inputs (no peaked attention rows) every "
            "top-k method's error is near 1 and says nothing; sweep its budget (as suites/fidelity.toml sweeps "
            'topk) or judge selection on real activations: quality = "minilm"',
            file=path,
            key=f"impl[{i}] ({impl.name})",
        )


def check_suite(suite: Suite, path: Path | None) -> None:
    """Everything a suite means; fills in its defaults (plug-ins made absolute, causal, activation)."""
    suite.plugins = plugins.resolve(suite.plugins, path)
    spec = _workload(suite.workload, path, "workload")
    causal, activation = spec.settings(suite.causal, suite.activation)
    # The file's activation is one of the field's Literal; when it gives none, the workload's (a str) fills it.
    suite.causal, suite.activation = causal, activation  # type: ignore[assignment]  # the workload's: a str
    suite.mode = suite.mode or spec.default_mode()
    if not suite.title:
        suite.title = suite.name
    _check_settings(spec, causal, activation, suite.mode, path)
    entries = _check_entries(suite, path)
    for name in sorted({s.name for s, _ in entries}):
        unavailable = workloads.lookup(name).unavailable
        problem = unavailable() if unavailable else None
        if problem:  # say so before running anything (an optional extra not installed)
            raise BadInput(problem, file=path, key="workload")
    specs = list({s.name: s for s, _ in entries}.values())
    _check_protocol(suite, path, specs)
    _check_shape(suite, path, specs)
    _check_sweep(suite, path, entries)
    _check_presets(suite, path, specs)
    _check_cpu_max(suite, path)
    _check_combinations(suite, path)
    _check_plot(suite, path, entries)
    _check_quality(suite, path, entries)
    _check_fidelity(suite, path, entries)
