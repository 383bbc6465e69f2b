"""The optional result columns of a case, computed in the child after its measurement.

A workload's own columns (``WorkloadSpec.extra_columns``: the pretrained model's
embedding fidelity); for suites with ``quality = [...]``, the selection quality of
the case's attention call against float64 exact attention on the same inputs
(:func:`quality_columns`); and, for suites with ``fidelity = true``, the layer's
fidelity against vanilla on the same inputs and weights:

``rel_err`` is the relative Frobenius error of the layer's output, ``grad_cos``
the cosine similarity of the input gradients (backward of a fixed random
upstream gradient, which probes more directions than the uniform one of
``out.mean()``). Both are computed at the case's ``seq_len`` when vanilla fits
the memory limit there, else at the largest ``seq_len / 2^i`` that fits
(``fidelity_seq_len`` says which). Vanilla's peak comes from the predict
backend (exact allocated bytes, nothing allocated). The limit is the case's
memory budget and, on the CPU, at most :data:`CPU_LIMIT_BYTES`: the dense
reference is quadratic in time as well, and must not push the case past its
time budget.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

import topk_bench.attention
from topk_bench import workloads
from topk_bench.case import Budget, Case
from topk_bench.errors import NonFinite
from topk_bench.extras import fidelity, quality
from topk_bench.measure.steps import dtype_of
from topk_bench.predict.backends import predict
from topk_bench.results import columns as col
from topk_bench.types import DeviceKind, Method, Mode
from topk_bench.units import GIB
from topk_bench.workloads import Workload, build
from topk_bench.workloads.attention import BUDGET, with_budget

CPU_LIMIT_BYTES = 2 * GIB
MIN_SEQ_LEN = 16


def vanilla_of(case: Case, seq_len: int) -> Case:
    """The same case with vanilla everywhere (attention, and the decoder's FF) at ``seq_len``."""
    params = {**case.param_dict, "seq_len": seq_len}
    return dataclasses.replace(
        case,
        impl="vanilla",
        options=(),
        ff_impl="vanilla" if case.ff_impl is not None else None,
        ff_options=(),
        params=tuple(sorted(params.items())),
        fidelity=False,
    )


def at_size(case: Case, seq_len: int) -> Case:
    params = {**case.param_dict, "seq_len": seq_len}
    return dataclasses.replace(case, params=tuple(sorted(params.items())), fidelity=False)


def memory_limit(case: Case, budget: Budget) -> int | None:
    limits = [budget.max_memory_bytes] if budget.max_memory_bytes is not None else []
    if case.device_kind is DeviceKind.CPU:
        limits.append(CPU_LIMIT_BYTES)
    return min(limits) if limits else None


def choose_seq_len(case: Case, budget: Budget) -> int:
    """The case's ``seq_len``, halved until vanilla's predicted fwd+bwd peak fits the limit."""
    limit = memory_limit(case, budget)
    seq_len = int(case.param_dict["seq_len"])
    if limit is None:
        return seq_len
    while True:
        probe = dataclasses.replace(vanilla_of(case, seq_len), method=Method.PREDICTED, mode=Mode.FWD_BWD)
        peak = predict(probe, Budget()).peak_bytes
        assert peak is not None, "a prediction has a peak"
        if peak <= limit:
            return seq_len
        if seq_len // 2 < MIN_SEQ_LEN:
            # Not a MemoryError: the case itself fitted, only its reference does not.
            raise ValueError(f"fidelity: vanilla does not fit {limit} bytes even at seq_len={seq_len}")
        seq_len //= 2


def _run(wl: Workload, upstream: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, input gradient) of one forward and backward of ``upstream``."""
    (x,) = wl.inputs
    x.grad = None
    out = wl()
    out.backward(upstream)
    assert x.grad is not None, "the workload's input requires grad"
    return out.detach(), x.grad.detach()


def against_vanilla(case: Case, seq_len: int) -> dict[str, Any]:
    """``rel_err`` and ``grad_cos`` of ``case`` at ``seq_len``; vanilla gets the case's weights and inputs."""
    dtype = dtype_of(case)
    approx = build(at_size(case, seq_len), case.device, dtype)
    exact = build(vanilla_of(case, seq_len), case.device, dtype)
    # Same weights: the projections and FF keys/values have the same names in both models;
    # only implementation state (Performer's random features) is the approximate model's own.
    exact.model.load_state_dict(approx.model.state_dict(), strict=False)
    exact.inputs = tuple(x.detach().clone().requires_grad_(True) for x in approx.inputs)
    (x,) = approx.inputs  # every layer workload maps [B, L, d] to [B, L, d]
    generator = torch.Generator(device="cpu").manual_seed(case.seed + 1)
    upstream = torch.randn(x.shape, generator=generator, dtype=dtype).to(x.device)
    out, grad = _run(approx, upstream)
    ref_out, ref_grad = _run(exact, upstream)
    return {
        col.REL_ERR: fidelity.rel_err(out, ref_out),
        col.GRAD_COS: fidelity.grad_cos(grad, ref_grad),
        col.FIDELITY_SEQ_LEN: seq_len,
    }


def is_vanilla(case: Case) -> bool:
    return case.impl == "vanilla" and case.ff_impl in (None, "vanilla")


def layer_columns(case: Case, budget: Budget) -> dict[str, Any]:
    seq_len = choose_seq_len(case, budget)
    if is_vanilla(case):  # vanilla against itself, by definition
        return {col.REL_ERR: 0.0, col.GRAD_COS: 1.0, col.FIDELITY_SEQ_LEN: seq_len}
    return against_vanilla(case, seq_len)


def _selection_quality(impl: str, q, k, v, out, options: dict[str, Any], causal: bool) -> dict[str, float]:
    """:func:`quality.selection_quality` of ``impl`` with ``options`` on ``q, k, v``, whose output is ``out``.

    The keys it attends: its registry ``selection``, with the options ``fn`` runs by (its defaults under
    ``options``); a dense exact entry attends every allowed key; an approximation that is no selection (Performer)
    gets ``attn_rel_err`` only."""
    entry = topk_bench.attention.spec(impl)
    if entry.selection is not None:
        selected = entry.selection(q, k, causal=causal, **entry.resolve(options))
    elif entry.exact:
        selected = quality.allowed_mask(q.shape[2], k.shape[2], causal, q.device).expand(*q.shape[:3], k.shape[2])
    else:
        selected = None
    return quality.selection_quality(q, k, v, selected, out, causal=causal)


def quality_random(case: Case) -> dict[str, float]:
    """On the case's own inputs: its workload built again (same seed, same inputs), one call outside any timing.
    Keyed by metric name (:data:`~topk_bench.results.columns.QUALITY_METRICS`)."""
    dtype = dtype_of(case)
    wl = build(case, case.device, dtype)
    with torch.no_grad():
        # Copies taken before the call: an implementation that writes into its inputs must not make the
        # reference (computed from them) agree with it.
        inputs_of = workloads.lookup(case.workload).attention_inputs
        assert inputs_of is not None, "suite checks: quality only on workloads with attention inputs"
        q, k, v = (x.clone() for x in inputs_of(wl))
        out = wl()
        return _selection_quality(case.impl, q, k, v, out, case.option_dict, case.causal)


def quality_minilm(case: Case) -> dict[str, float]:
    """On the pretrained MiniLM's q, k, v of each layer over the shipped corpus (512 tokens), averaged over layers.

    The encoder's own attention: every query over all keys (not causal). A swept ``budget`` (tokens of the
    case's cache) becomes the same share of MiniLM's keys (at least 1); otherwise the options are used as given.
    """
    from topk_bench.workloads.pretrained.activations import corpus_activations

    dtype = dtype_of(case)
    layers = corpus_activations()
    options = case.option_dict
    tokens = case.param_dict.get(BUDGET, 0)
    if tokens:
        length = layers[0]["k"].shape[2]
        options = with_budget(case.impl, options, max(1, round(tokens * length / cache_length(case))))
    per_layer = []
    fn = topk_bench.attention.get(case.impl)
    with torch.no_grad():
        for acts in layers:
            q, k, v = (acts[name].to(case.device, dtype) for name in ("q", "k", "v"))
            out = fn(q.clone(), k.clone(), v.clone(), causal=False, activation=case.activation, **options)  # see above
            per_layer.append(_selection_quality(case.impl, q, k, v, out, options, causal=False))
    return {name: sum(m[name] for m in per_layer) / len(per_layer) for name in per_layer[0]}


def cache_length(case: Case) -> int:
    """Keys of the case's attention call, from its shapes (decode: ``kv_len + new_tokens``, prefill: ``seq_len``)."""
    p = workloads.lookup(case.workload).shape(case)
    return int(p["kv_len"] + p["new_tokens"]) if "kv_len" in p else int(p["seq_len"])


def quality_peaked(case: Case) -> dict[str, float]:
    """On synthetic peaked inputs (:func:`topk_bench.extras.peaked.peaked_qkv`: sinks, locality, heavy hitters) of
    the shapes of the case's attention call, drawn from the case's seed, in its dtype; the implementation's function
    with the case's options (a swept ``budget`` already in them), causal as the case. An implementation whose
    registry entry has a ``selection`` reports its recalls, any other its output error (as the other kinds)."""
    from topk_bench.extras.peaked import peaked_qkv

    dtype = dtype_of(case)
    inputs_of = workloads.lookup(case.workload).attention_inputs
    assert inputs_of is not None, "suite checks: quality only on workloads with attention inputs"
    # Shapes only: the workload's own inputs are built on the meta device.
    q0, k0, v0 = inputs_of(build(case, torch.device("meta"), dtype))
    b, hq, lq, d = q0.shape
    hkv, lk = k0.shape[1], k0.shape[2]
    q, k, v = (
        x.to(case.device)
        for x in peaked_qkv(b, hq, hkv, lq, lk, d, seed=case.seed, dtype=dtype, value_dim=v0.shape[-1])
    )
    options = case.option_dict
    with torch.no_grad():
        fn = topk_bench.attention.get(case.impl)
        out = fn(q.clone(), k.clone(), v.clone(), causal=case.causal, activation=case.activation, **options)
        return _selection_quality(case.impl, q, k, v, out, options, case.causal)


QUALITY = {"random": quality_random, "minilm": quality_minilm, "peaked": quality_peaked}


def quality_columns(case: Case) -> dict[str, Any]:
    """``quality = [...]``: per input kind, its columns (:data:`topk_bench.results.columns.QUALITY`):
    ``topk_recall``, ``mass_recall``, ``attn_rel_err`` against float64 exact attention on the same inputs, and
    ``attended_fraction`` (docs/CONTRACTS.md)."""
    columns: dict[str, Any] = {}
    for kind in case.quality:
        columns.update({col.QUALITY[kind][name]: value for name, value in QUALITY[kind](case).items()})
    return columns


def extra_columns(case: Case, budget: Budget) -> dict[str, Any]:
    """The optional columns of a case: its workload's own, layer fidelity when the suite asks (``fidelity = true``),
    selection quality when it asks (``quality = [...]``).

    Raises NonFinite when one of them is NaN or inf."""
    columns: dict[str, Any] = {}
    own = workloads.lookup(case.workload).extra_columns
    if own is not None:
        columns.update(own(case, budget))
    if case.fidelity:
        columns.update(layer_columns(case, budget))
    if case.quality and not case.predicted:  # a prediction computes no values: the columns stay empty
        columns.update(quality_columns(case))
    bad = [
        f"{name} = {value}" for name, value in columns.items() if isinstance(value, float) and not math.isfinite(value)
    ]
    if bad:  # readers leave out a row with such a number: the case is nonfinite instead
        raise NonFinite(f"not finite: {', '.join(bad)}")
    return columns
