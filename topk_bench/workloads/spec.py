"""What a workload is: its spec (parameters, defaults, rules, builder) and the built model with its inputs.

A workload is one :class:`WorkloadSpec`, registered with :func:`register` by
its own module (``mha.py``, ``ff.py``...) or by a plug-in named in a suite's
``plugins``. Everything else in the harness — suite checks, the sweep, the
support rule, the measurement, the CSV's columns — asks the spec; no other
module knows a workload by name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from topk_bench.case import Budget, Case
from topk_bench.protocol import OURS
from topk_bench.types import Mode


@dataclass
class Workload:
    """A built case: the model and its inputs; ``model(*inputs)`` is one forward.

    ``kept``: other tensors built with the model, before the measured region, that stay alive
    through it without being inputs (the paper protocol's causal mask); counted in the baseline.
    """

    model: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    kept: tuple[torch.Tensor, ...] = ()

    def __call__(self) -> torch.Tensor:
        return self.model(*self.inputs)

    def clear_grads(self) -> None:
        """Drop gradients of a previous iteration so that every iteration starts from the same live set."""
        for p in self.model.parameters():
            p.grad = None
        for x in self.inputs:
            x.grad = None


Builder = Callable[[Case, torch.device, torch.dtype], Workload]


@dataclass(frozen=True)
class Traffic:
    """What one iteration of a case does by its workload's stated cost model (not by measuring it).

    ``flops``: floating-point operations of the computation the workload stands for, the same
    for every implementation (so that FLOP/s compares implementations); ``bytes``: bytes it must
    read and write at least; ``tokens``: tokens it produces, all sequences of the batch;
    ``tokens_per_sequence``: of those, per sequence (time per token = time / this);
    ``kv_cache_bytes``: the KV cache it reads, when it has one. The row derives the rates
    (:mod:`topk_bench.results.rates`); docs/CONTRACTS.md states each workload's model.
    """

    flops: int
    bytes: int
    tokens: int
    tokens_per_sequence: int
    kv_cache_bytes: int | None = None


@dataclass(frozen=True)
class Fixed:
    """A setting the workload imposes (the feed-forward layer has no mask, a decode step has no backward):
    its value and the message when violated."""

    value: Any
    problem: str


@dataclass(frozen=True)
class WorkloadSpec:
    """Everything the harness needs to know about a workload.

    ``params`` are its shape parameters with their defaults (a suite's ``[shape]``
    and ``[sweep]`` keys); with ``open_params`` any other key a suite gives that
    is not an implementation option is a parameter too (the pretrained model's
    switches). ``fixed`` maps ``"causal"`` / ``"activation"`` to what the workload
    imposes. ``feedforward`` says whether an ``[[impl]]`` may choose a
    feed-forward implementation (``default_feedforward`` when it does not; None:
    the model keeps its own). ``check_params`` returns ``(parameter, problem)``
    for an impossible combination. ``columns`` are the result columns its cases
    fill, computed in the child by ``extra_columns(case, budget)`` after the
    measurement. ``legend(attention, feedforward)`` composes an entry's label.
    ``protocols``: the protocols (:mod:`topk_bench.protocol`) its builder follows; one that
    follows ``paper`` builds its attention layers with
    :func:`topk_bench.workloads.protocol.attention_layer`.
    """

    name: str
    description: str
    build: Builder
    params: Mapping[str, Any]
    open_params: bool = False
    # Parameters a case holds only when its suite gives them (their default is "not used"), so that adding
    # one leaves the ids of the cases without it unchanged.
    optional_params: tuple[str, ...] = ()
    causal: bool = False
    activation: str = "softmax"
    fixed: Mapping[str, Fixed] = field(default_factory=dict)
    mode: Mode = Mode.FWD_BWD
    presets: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)
    grouped_heads: Callable[[Mapping[str, Any]], bool] | None = None
    traffic: Callable[[Case], Traffic] | None = None
    feedforward: bool = False
    default_feedforward: str | None = None
    swept_options_reach_feedforward: bool = False
    check_params: Callable[[Mapping[str, Any]], tuple[str, str] | None] | None = None
    columns: tuple[str, ...] = ()
    extra_columns: Callable[[Case, Budget], dict[str, Any]] | None = None
    legend: Callable[[str, str | None], str] | None = None
    # A problem that keeps its cases from running here at all (an optional extra not installed), or None.
    unavailable: Callable[[], str | None] | None = None
    # Can ``--predict`` size it (FakeTensorMode)? False: its cases are recorded unsupported there.
    predictable: bool = True
    protocols: tuple[str, ...] = (OURS.name,)
    # The (q, k, v) its attention call sees, from a built workload (selection quality, ``quality = [...]``);
    # None: the workload has no single attention call to measure it on.
    attention_inputs: Callable[[Workload], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None

    def settings(self, causal: bool | None, activation: str | None) -> tuple[bool, str]:
        """(causal, activation): what is given, else what the workload imposes, else its defaults."""
        causal = causal if causal is not None else self.fixed.get("causal", Fixed(self.causal, "")).value
        activation = activation or self.fixed.get("activation", Fixed(self.activation, "")).value
        return bool(causal), str(activation)

    def default_mode(self) -> Mode:
        """The mode a suite gets when it names none: what the workload imposes, else its default."""
        return Mode(self.fixed.get("mode", Fixed(self.mode, "")).value)

    def violation(self, causal: bool, activation: str, mode: str | None = None) -> tuple[str, str] | None:
        """(setting, problem) when ``causal`` / ``activation`` / ``mode`` contradict what the workload imposes."""
        for name, value in (("causal", causal), ("activation", activation), ("mode", mode)):
            rule = self.fixed.get(name)
            if rule is not None and value is not None and value != rule.value:
                return name, rule.problem
        return None

    def with_presets(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` with what their preset values set (``model = "llama-3-8b"``: its head counts)."""
        out = dict(params)
        for name, table in self.presets.items():
            if out.get(name) is not None:
                out.update(table.get(out[name], {}))
        return out

    def shape(self, case: Case) -> dict[str, Any]:
        """The case's parameters over the defaults, presets applied; an unknown parameter raises ``ValueError``."""
        given = case.param_dict
        if not self.open_params:
            unknown = sorted(set(given) - set(self.params))
            if unknown:
                raise ValueError(
                    f"workload {self.name!r} has no parameter {unknown[0]!r} (parameters: {', '.join(self.params)})"
                )
        return self.with_presets({**self.params, **given})


class UnknownWorkload(KeyError):
    def __str__(self) -> str:  # KeyError would quote the whole message
        return self.args[0]


_REGISTRY: dict[str, WorkloadSpec] = {}


def register(spec: WorkloadSpec) -> WorkloadSpec:
    if spec.name in _REGISTRY:
        raise ValueError(f"workload {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def lookup(name: str) -> WorkloadSpec:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownWorkload(f"unknown workload {name!r} (known: {', '.join(names())})") from None


def names() -> list[str]:
    return sorted(_REGISTRY)


def build(case: Case, device, dtype) -> Workload:
    """The case's model and inputs, seeded from ``case.seed`` (the same case always gets the same weights)."""
    spec = lookup(case.workload)
    torch.manual_seed(case.seed)
    # Built directly on the device in the dtype (no ``.to()`` copy, which FakeTensorMode refuses).
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return spec.build(case, torch.device(device), dtype)
    finally:
        torch.set_default_dtype(previous)


def traffic(case: Case) -> Traffic | None:
    """What one iteration of ``case`` does by its workload's cost model; None when the workload states none.

    A plug-in's model is user code: what it returns is checked here (ValueError), so that no row gets a
    number the reader would refuse (NaN, negative) and no rate divides by zero tokens.
    """
    spec = lookup(case.workload)
    if spec.traffic is None:
        return None
    value = spec.traffic(case)
    if not isinstance(value, Traffic):
        raise ValueError(f"expected a Traffic, got {value!r}")
    counts = {
        "flops": value.flops,
        "bytes": value.bytes,
        "tokens": value.tokens,
        "tokens_per_sequence": value.tokens_per_sequence,
        "kv_cache_bytes": value.kv_cache_bytes,
    }
    for name, number in counts.items():
        if number is None and name == "kv_cache_bytes":
            continue
        if (
            isinstance(number, bool)
            or not isinstance(number, (int, float))
            or not math.isfinite(number)
            or number < (1 if name == "tokens_per_sequence" else 0)
        ):
            bound = "> 0" if name == "tokens_per_sequence" else ">= 0"
            raise ValueError(f"expected {name} a finite number {bound}, got {number!r}")
    return value


def hidden_states(batch: int, seq_len: int, d_model: int, device, dtype) -> torch.Tensor:
    """Random hidden states ``[batch, seq_len, d_model]`` that require grad: a layer measured as it sits
    inside a network, where backward also produces the gradient of its input."""
    return torch.randn(batch, seq_len, d_model, device=device, dtype=dtype, requires_grad=True)
