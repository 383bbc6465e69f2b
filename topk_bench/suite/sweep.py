"""A suite expanded into cases: the grid ``[sweep]`` x ``[[impl]]``, with each key routed where it belongs.

Cases come out size-major (every implementation at the smallest size first),
so that an interrupted run has comparable points for all implementations, and
so that within one implementation a smaller size always runs before a larger
one — what the skip-larger rule (:mod:`topk_bench.run.order`) needs.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

import topk_bench.attention
from topk_bench import workloads
from topk_bench.case import Case, Measuring
from topk_bench.errors import BadInput
from topk_bench.suite.schema import ImplEntry, Suite
from topk_bench.types import DType
from topk_bench.workloads.attention import BUDGET, with_budget


def entry_settings(suite: Suite, entry: ImplEntry) -> tuple[str, bool, str]:
    """(workload, causal, activation) of an ``[[impl]]``: its own, else the suite's, else its workload's."""
    workload = entry.workload or suite.workload
    same = workload == suite.workload
    causal = entry.causal if entry.causal is not None else (suite.causal if same else None)
    activation = entry.activation or (suite.activation if same else None)
    return (workload, *workloads.lookup(workload).settings(causal, activation))


def entry_mode(suite: Suite, entry: ImplEntry) -> str:
    """``fwd`` or ``fwd_bwd`` of an ``[[impl]]``: its own, else the suite's (filled in from its workload when it
    names none)."""
    return entry.mode or suite.mode or workloads.lookup(entry_settings(suite, entry)[0]).default_mode()


def feedforward(suite: Suite, entry: ImplEntry) -> str | None:
    """The feed-forward implementation an entry names, else its workload's default (None: none, or the model's own)."""
    spec = workloads.lookup(entry_settings(suite, entry)[0])
    return (entry.feedforward or spec.default_feedforward) if spec.feedforward else None


def route(suite: Suite, entry: ImplEntry, swept: dict[str, Any]) -> tuple[dict, dict, dict]:
    """(parameters, attention options, feed-forward options) of one grid point of an entry.

    A ``[shape]`` or ``[sweep]`` key is a parameter of the workload when it has it;
    otherwise an option of the implementation (``chunk_size`` in Fig. 2) or, for a
    workload whose swept options reach its feed-forward sublayer, of whichever of
    the two has that option; a workload with open parameters takes the rest. A
    preset (``model = "llama-3-8b"``) fills in the parameters it sets.
    """
    spec = workloads.lookup(entry_settings(suite, entry)[0])
    impl = topk_bench.attention.spec(entry.name)
    ff_name = feedforward(suite, entry)
    ff = topk_bench.attention.spec(ff_name) if ff_name and spec.swept_options_reach_feedforward else None
    # An optional parameter (decode's budget) is in a case only when the suite gives it: the ids of cases
    # without it do not change.
    params = {k: v for k, v in spec.params.items() if k not in spec.optional_params}
    params.update({k: v for k, v in suite.shape.items() if spec.open_params or k in spec.params})
    options, ff_options = dict(entry.options), dict(entry.feedforward_options)
    for key, value in swept.items():
        reaches = key in impl.options or (ff is not None and key in ff.options)
        if key in spec.params or (spec.open_params and not reaches):
            params[key] = value
            continue
        if key in impl.options or ff is None:
            options[key] = value
        if ff is not None and key in ff.options:
            ff_options[key] = value
    return spec.with_presets(params), options, ff_options


def is_size(values: list) -> bool:
    """Swept sizes (numbers: sorted, and larger ones skipped after a failure), not names (models: in file order)."""
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def grid(suite: Suite) -> list[dict[str, Any]]:
    """The swept values, smallest first (names in their order in the file), one dict per point."""
    keys = list(suite.sweep)
    values = [sorted(suite.sweep[k]) if is_size(suite.sweep[k]) else list(suite.sweep[k]) for k in keys]
    return [dict(zip(keys, point)) for point in itertools.product(*values)]


def count(suite: Suite, limits: dict[str, int] | None = None) -> int:
    """How many cases :func:`expand` gives, without building them; with ``limits`` (swept size -> largest
    value, ``cpu_max``), how many of them are within those."""
    limits = limits or {}

    # Names (a swept model) are never above a limit: checks.py refuses a limit on them, after the count.
    def above(name: str, v: Any) -> bool:
        return name in limits and isinstance(v, (int, float)) and v > limits[name]

    kept = ([v for v in values if not above(name, v)] for name, values in suite.sweep.items())
    return math.prod(len(values) for values in kept) * len(suite.impl)


def _resolved(impl: topk_bench.attention.Implementation, given: dict[str, Any], suite: Suite) -> dict[str, Any]:
    # Defaults included, so that the CSV shows what ran; None means "not used" and is left out,
    # as are the options the suite's protocol sets itself (the workload passes them).
    owned = suite.measured_by.owned_options
    return {k: v for k, v in impl.resolve(given).items() if v is not None and k not in owned}


def _label(suite: Suite, entry: ImplEntry, options: dict[str, Any], workload: str) -> str:
    if entry.label:
        return entry.label
    return _legend(suite, entry, options, workload) + (_compiled(entry) if entry.compile else "")


def _compiled(entry: ImplEntry) -> str:
    """What a compiled entry's legend adds, so that it stands apart from the same entry eager."""
    return f" (compiled, {entry.compile_mode})" if entry.compile_mode else " (compiled)"


def _legend(suite: Suite, entry: ImplEntry, options: dict[str, Any], workload: str) -> str:
    impl = topk_bench.attention.spec(entry.name)
    # A legend would freeze one swept value of an option: the bare name then.
    # So would a swept token budget, which sets a selection method's own option.
    swept = any(key in impl.options for key in suite.sweep) or (BUDGET in suite.sweep and impl.budget is not None)
    legend = impl.name if swept else _impl_legend(impl, options, hidden=_one_chunk(suite, workload, options))
    spec = workloads.lookup(workload)
    if spec.legend is not None:
        ff_name = feedforward(suite, entry)
        ff_legend = topk_bench.attention.spec(ff_name).legend(entry.feedforward_options) if ff_name else None
        legend = spec.legend(legend, ff_legend)
    return legend


def _one_chunk(suite: Suite, workload: str, options: dict[str, Any]) -> tuple[str, ...]:
    """("chunk_size",) when every case's queries fit in one query chunk (a decode step's new tokens), so that the
    chunk size changes nothing and the legend leaves it out; else ()."""
    defaults = workloads.lookup(workload).params
    if "new_tokens" not in defaults or not isinstance(options.get("chunk_size"), int):
        return ()
    tokens = suite.sweep.get("new_tokens") or [suite.shape.get("new_tokens", defaults["new_tokens"])]
    return ("chunk_size",) if all(isinstance(t, int) and t <= options["chunk_size"] for t in tokens) else ()


def _impl_legend(impl: topk_bench.attention.Implementation, options: dict[str, Any], hidden: tuple[str, ...]) -> str:
    """The implementation's legend without the ``name={option}`` parts of ``hidden`` options:
    "Top-k (size={chunk_size}, topk={topk})" -> "Top-k (topk=128)"."""
    template = impl.label or impl.name
    for option in hidden:
        template = re.sub(r"\w+=\{" + option + r"\}(, )?", "", template).replace(", )", ")").replace(" ()", "")
    return template.format(**impl.resolve(options))


def case_of(suite: Suite, entry: ImplEntry, swept: dict[str, Any], **fields: Any) -> Case:
    workload, causal, activation = entry_settings(suite, entry)
    params, given, ff_given = route(suite, entry, swept)
    # A swept token budget (decode's ``budget``) sets each selection method's own budget option.
    options = _resolved(
        topk_bench.attention.spec(entry.name), with_budget(entry.name, given, params.get(BUDGET, 0)), suite
    )
    ff_impl = feedforward(suite, entry)
    ff_options = _resolved(topk_bench.attention.spec(ff_impl), ff_given, suite) if ff_impl else None
    if entry.dtype is not None:  # the entry's own dtype, over the suite's and bench.toml's
        fields = {**fields, "dtype": DType(entry.dtype)}
    return Case.make(
        suite=suite.name,
        workload=workload,
        impl=entry.name,
        params=params,
        options=options,
        ff_impl=ff_impl,
        ff_options=ff_options,
        label=_label(suite, entry, options, workload),
        mode=entry_mode(suite, entry),
        causal=causal,
        activation=activation,
        seed=suite.seed,
        plugins=tuple(suite.plugins),
        fidelity=suite.fidelity,
        protocol=suite.protocol,
        quality=tuple(dict.fromkeys(suite.quality)),
        compile=entry.compile,
        compile_mode=entry.compile_mode,
        **fields,
    )


def expand(suite: Suite, measuring: Measuring) -> list[Case]:
    """Every case of the grid ``[sweep]`` x ``[[impl]]``, size-major, each measured as ``measuring`` says;
    BadInput when two entries give one case."""
    cases: list[Case] = []
    first: dict[str, int] = {}  # case_id -> the entry that gave it first
    given = measuring.case_fields()
    for point in grid(suite):
        for i, entry in enumerate(suite.impl):
            case = case_of(suite, entry, point, **given)
            _distinct(suite, first.setdefault(case.case_id, i), i, point)
            cases.append(case)
    return cases


def _distinct(suite: Suite, earlier: int, entry: int, point: dict[str, Any]) -> None:
    """Two entries must not give the same case: they would share its case_id (one row, one curve, a compare
    that never matches). The label is a legend, not part of what is measured."""
    if earlier == entry:
        return
    at = ", ".join(f"{k}={v}" for k, v in point.items())
    raise BadInput(
        f"measures the same case as impl[{earlier}] ({suite.impl[earlier].name}) at {at}: entries that "
        "differ only in their label (or in an option the sweep sets for both) would share its case_id; "
        "give it another option or remove it",
        file=suite.path,
        key=f"impl[{entry}] ({suite.impl[entry].name})",
    )
