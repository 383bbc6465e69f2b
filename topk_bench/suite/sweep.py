"""A suite expanded into cases, and the notion of "a larger size of the same implementation".

Cases come out size-major (every implementation at the smallest size first),
so that an interrupted run has comparable points for all implementations, and
so that within one implementation a smaller size always runs before a larger
one — what the skip-larger rule needs.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import implementations
from topk_bench.case import Case
from topk_bench.config import SHAPE_DEFAULTS, Suite


def _options(impl: implementations.Implementation, given: dict[str, Any]) -> dict[str, Any]:
    # Resolved (defaults included) so the CSV shows what ran; None means "not used" and is left out.
    return {k: v for k, v in impl.resolve(given).items() if v is not None}


def _label(suite: Suite, entry, impl, options: dict[str, Any], workload: str) -> str:
    if entry.label:
        return entry.label
    if any(key in impl.options for key in suite.sweep):  # the legend would freeze one swept value
        legend = impl.name
    else:
        legend = impl.legend(options)
    if workload == "decoder":
        ff = implementations.spec(entry.feedforward or "vanilla")
        legend = f"{legend} + {ff.legend(entry.feedforward_options)} FF"
    return legend


def _case(suite: Suite, entry, swept: dict[str, Any], **fields: Any) -> Case:
    workload, causal, activation = suite.entry_settings(entry)
    impl = implementations.spec(entry.name)
    shape_params = SHAPE_DEFAULTS.get(workload)
    # [shape] and [sweep] keys apply where the workload has them (all of them for pretrained);
    # a swept key that is not a shape parameter is an option of the implementation.
    params = dict(shape_params or {})
    params.update({k: v for k, v in suite.shape.items() if shape_params is None or k in shape_params})
    given = dict(entry.options)
    # pretrained: `feedforward` replaces the model's FF (none: it keeps its own); a swept key goes to
    # the implementation(s) having that option (topk at attention or at FF), else it is a parameter.
    ff_spec = implementations.spec(entry.feedforward) if workload == "pretrained" and entry.feedforward else None
    ff_given = dict(entry.feedforward_options)
    for key, value in swept.items():
        if shape_params is None and (key in impl.options or (ff_spec and key in ff_spec.options)):
            if key in impl.options:
                given[key] = value
            if ff_spec and key in ff_spec.options:
                ff_given[key] = value
        elif shape_params is None or key in shape_params:
            params[key] = value
        else:
            given[key] = value
    options = _options(impl, given)
    ff_impl = ff_options = None
    if workload == "decoder":
        ff_impl = entry.feedforward or "vanilla"
        ff_options = _options(implementations.spec(ff_impl), entry.feedforward_options)
    elif ff_spec is not None:
        ff_impl, ff_options = ff_spec.name, _options(ff_spec, ff_given)
    return Case.make(
        suite=suite.name, workload=workload, impl=entry.name, params=params, options=options,
        ff_impl=ff_impl, ff_options=ff_options, label=_label(suite, entry, impl, options, workload),
        mode=suite.mode, causal=causal, activation=activation, seed=suite.seed,
        plugins=tuple(suite.plugins), fidelity=suite.fidelity, **fields,
    )


def expand(suite: Suite, *, device: str, method: str, dtype: str, warmup: int, repeats: int) -> list[Case]:
    """Every case of the grid ``[sweep]`` x ``[[impl]]``, size-major."""
    keys = list(suite.sweep)
    grid = itertools.product(*(sorted(suite.sweep[k]) for k in keys))
    return [
        _case(suite, entry, dict(zip(keys, point)), dtype=dtype, device=device, method=method,
              warmup=warmup, repeats=repeats)
        for point in grid for entry in suite.impl
    ]


# ------------------------------------------------------------ sizes and the skip-larger rule


def _value(case: Case, key: str) -> Any:
    params = case.param_dict
    return params[key] if key in params else case.option_dict.get(key)


def size(case: Case, keys: list[str]) -> tuple:
    """The case's swept values, in the suite's sweep order."""
    return tuple(_value(case, key) for key in keys)


def family(case: Case, keys: list[str]) -> Case:
    """The case with its swept values removed: cases of one family differ only in size."""
    return dataclasses.replace(
        case,
        params=tuple((k, v) for k, v in case.params if k not in keys),
        options=tuple((k, v) for k, v in case.options if k not in keys),
        warmup=0, repeats=0,
    )


def larger(case: Case, than: Case, keys: list[str]) -> bool:
    """Same implementation and options, every swept value at least as large and one larger."""
    a, b = size(case, keys), size(than, keys)
    if a == b or family(case, keys) != family(than, keys):
        return False
    return all(x is not None and y is not None and x >= y for x, y in zip(a, b))


def describe_size(case: Case, keys: list[str]) -> str:
    return " ".join(f"{k}={v}" for k, v in zip(keys, size(case, keys)))


# ---------------------------------------------------------------- CSV parameter columns


def parameters(case: Case) -> dict[str, Any]:
    """The case's parameter columns: shape, options, the decoder's FF implementation, masking, dtype."""
    row: dict[str, Any] = dict(case.params)
    row.update(case.options)
    if case.ff_impl is not None:
        row["ff_impl"] = case.ff_impl
        row.update({f"ff_{k}": v for k, v in case.ff_options})
    row.update(causal=case.causal, activation=case.activation, dtype=case.dtype)
    return row


def parameter_columns(cases: list[Case]) -> list[str]:
    """Union of the cases' parameter columns, in first-seen order (shape parameters first)."""
    columns: dict[str, None] = {}
    for case in cases:
        columns.update(dict.fromkeys(parameters(case)))
    head = ("seq_len", "batch", "d_model", "heads", "d_ff", "layers")
    tail = ("causal", "activation", "dtype")
    middle = [c for c in columns if c not in head and c not in tail]
    return [c for c in head if c in columns] + middle + [c for c in tail if c in columns]
