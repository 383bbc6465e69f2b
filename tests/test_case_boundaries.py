"""Property: a case, its budget and its measurement are one value across every boundary they cross.

The parent writes ``case.to_json()`` for its child (run/launcher.py), the warm template and the child read
``Case.from_json`` (child/warmup.py, child/worker.py), a Slurm job gets both as JSON through submitit's pickle
(run/slurm/executor.py ``run_in_job``), and the result comes back as ``Measurement.to_json()``. Whatever crosses
must come back equal *with its member types* (a ``str`` enum equals its spelling, so ``==`` alone would pass a
case whose ``timer`` is the string ``"cudagraph"``: every ``case.timer is Timer.CUDAGRAPH`` would then be False)
and with the same ``case_id``.

The strategies are keyed by field name and checked against the dataclass's fields: a new field fails here until
it is given one.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import pickle
import typing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topk_bench.case import Budget, Case, Measurement
from topk_bench.run.slurm.executor import run_in_job
from topk_bench.status import Status
from topk_bench.types import DType, GpuModel, Method, Mode, Timer

names = st.text(max_size=12)
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), names)
pairs = st.dictionaries(names, scalars, max_size=4).map(lambda d: tuple(sorted(d.items())))
words = st.lists(names, max_size=3).map(tuple)
counts = st.integers(min_value=0, max_value=10**6)
seconds = st.floats(min_value=0, max_value=1e6)

CASE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "suite": names,
    "workload": names,
    "impl": names,
    "params": pairs,
    "options": pairs,
    "ff_impl": st.none() | names,
    "ff_options": pairs,
    "label": names,
    "mode": st.sampled_from(Mode),
    "causal": st.booleans(),
    "activation": names,
    "dtype": st.sampled_from(DType),
    "device": st.sampled_from(["cpu", "cuda", "cuda:1"]),
    "method": st.sampled_from(Method),
    "seed": st.integers(),
    "warmup": counts,
    "repeats": counts,
    "threads": st.none() | counts,
    "warmup_s": seconds,
    "min_sample_s": seconds,
    "timer": st.none() | st.sampled_from(Timer),
    "flush_l2": st.booleans(),
    "compile": st.booleans(),
    "compile_mode": st.none() | names,
    "plugins": words,
    "fidelity": st.booleans(),
    "protocol": st.sampled_from(["ours", "paper"]),
    "quality": words,
    "gpu": st.none() | st.sampled_from(GpuModel),
    "code_path": names,
    "profile": names,
}
BUDGET_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "max_memory_bytes": st.none() | counts,
    "max_seconds": st.none() | seconds,
}
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3), max_leaves=6)
MEASUREMENT_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "status": st.sampled_from(Status),
    "error": names,
    "peak_bytes": st.none() | counts,
    "reserved_bytes": st.none() | counts,
    "baseline_bytes": st.none() | counts,
    "times_s": st.lists(seconds, max_size=4),
    "fwd_times_s": st.lists(seconds, max_size=4),
    "bwd_times_s": st.lists(seconds, max_size=4),
    "flops": st.none() | counts,
    "device_name": names,
    "metadata": st.dictionaries(names, json_values, max_size=4),
    "extra": st.dictionaries(names, json_values, max_size=4),
}
STRATEGIES = {Case: CASE_FIELDS, Budget: BUDGET_FIELDS, Measurement: MEASUREMENT_FIELDS}


def values_of(cls: type) -> st.SearchStrategy[Any]:
    return st.builds(cls, **STRATEGIES[cls])


def typed(value: Any) -> Any:
    """``value`` with the type of every part spelled out: equal only when the types are too."""
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(typed(v) for v in value))
    if isinstance(value, dict):
        return (dict, tuple((k, typed(v)) for k, v in value.items()))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value), tuple((f.name, typed(getattr(value, f.name))) for f in dataclasses.fields(value)))
    return (type(value), value)


def assert_same(back: Any, sent: Any) -> None:
    for f in dataclasses.fields(sent):
        assert typed(getattr(back, f.name)) == typed(getattr(sent, f.name)), f.name
    assert back == sent


@pytest.mark.parametrize("cls", list(STRATEGIES), ids=lambda c: c.__name__)
def test_every_field_has_a_strategy(cls):
    assert set(STRATEGIES[cls]) == {f.name for f in dataclasses.fields(cls)}


@settings(max_examples=60, deadline=None)
@given(case=values_of(Case))
def test_a_case_crosses_json_and_pickle_whole(case):
    for back in (Case.from_json(case.to_json()), pickle.loads(pickle.dumps(case))):
        assert_same(back, case)
        assert back.case_id == case.case_id
        assert hash(back) == hash(case)


@settings(max_examples=30, deadline=None)
@given(budget=values_of(Budget), measurement=values_of(Measurement))
def test_a_budget_and_a_measurement_cross_json_and_pickle_whole(budget, measurement):
    for back_budget in (Budget.from_json(budget.to_json()), pickle.loads(pickle.dumps(budget))):
        assert_same(back_budget, budget)
    for back in (Measurement.from_json(measurement.to_json()), pickle.loads(pickle.dumps(measurement))):
        assert_same(back, measurement)


@settings(max_examples=30, deadline=None)
@given(case=values_of(Case), budget=values_of(Budget), measurement=values_of(Measurement))
def test_the_slurm_path_hands_the_job_the_case_and_returns_the_measurement(case, budget, measurement):
    seen: list[tuple[Case, Budget]] = []

    def run(job_case: Case, job_budget: Budget) -> Measurement:
        seen.append((job_case, job_budget))
        return dataclasses.replace(measurement, metadata=dict(measurement.metadata))

    # submitit pickles the job's arguments and its result: the strings cross a pickle too.
    arguments = pickle.loads(pickle.dumps((case.to_json(), budget.to_json())))
    returned = pickle.loads(pickle.dumps(run_in_job(*arguments, run=run)))
    ((job_case, job_budget),) = seen
    assert_same(job_case, case)
    assert job_case.case_id == case.case_id
    assert_same(job_budget, budget)
    back = Measurement.from_json(returned)
    assert typed(back.status) == typed(measurement.status)
    assert back.times_s == measurement.times_s


def enum_fields(cls: type) -> list[tuple[str, type[enum.Enum]]]:
    """The fields of ``cls`` whose annotation holds an enum, with it."""
    found = []
    for name, hint in typing.get_type_hints(cls).items():
        for kind in (hint, *typing.get_args(hint)):
            if isinstance(kind, type) and issubclass(kind, enum.Enum):
                found.append((name, kind))
    return found


@pytest.mark.parametrize(
    ("cls", "name", "member"),
    [(cls, name, member) for cls in STRATEGIES for name, kind in enum_fields(cls) for member in kind],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_every_member_of_every_enum_field_crosses_as_itself(cls, name, member):
    base = {Case: dict(suite="s", workload="mha", impl="vanilla", params=()), Measurement: dict(status=Status.OK)}
    value = cls(**{**base.get(cls, {}), name: member})
    back = type(value).from_json(value.to_json())
    assert getattr(back, name) is member
    if cls is Case:
        assert back.case_id == value.case_id


def test_the_child_reads_a_cudagraph_case_as_one():
    """The issue's reproduction: the timer the parent set is the one the child sees."""
    case = Case.make(suite="s", workload="mha", impl="vanilla", params={"seq_len": 8}, timer=Timer.CUDAGRAPH)
    assert Case.from_json(case.to_json()).timer is Timer.CUDAGRAPH


def test_a_spelled_case_holds_members_and_tuples():
    """A case made from its spellings (a suite, a JSON file) holds members and tuples, as one made from them."""
    spelled = Case(
        suite="s",
        workload="mha",
        impl="vanilla",
        params=[["seq_len", 8]],  # type: ignore[arg-type]
        timer="cudagraph",  # type: ignore[arg-type]
        gpu="sm80",  # type: ignore[arg-type]
        plugins=["a.b"],  # type: ignore[arg-type]
    )
    assert spelled.timer is Timer.CUDAGRAPH and spelled.gpu is GpuModel.A100_80GB
    assert spelled.params == (("seq_len", 8),) and type(spelled.params[0]) is tuple
    assert spelled.plugins == ("a.b",) and type(spelled.plugins) is tuple
    with pytest.raises(
        ValueError, match=r"unknown timer 'graphs' \(known: perf_counter, process_time, events, cudagraph\)"
    ):
        Case(suite="s", workload="mha", impl="vanilla", params=(), timer="graphs")  # type: ignore[arg-type]


def test_an_integral_float_budget_is_read_as_bytes():
    """The worker's --budget is JSON a person may write as 1e9 (its own help does)."""
    budget = Budget.from_json(json.dumps({"max_memory_bytes": 1e9}))
    assert budget.max_memory_bytes == 10**9 and type(budget.max_memory_bytes) is int
