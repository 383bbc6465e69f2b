"""The optional result columns of a case, computed in the child after its measurement.

A workload's own columns (``WorkloadSpec.extra_columns``: the pretrained model's
embedding fidelity), and, for suites with ``fidelity = true``, the layer's
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

from topk_bench import workloads
from topk_bench.case import Budget, Case
from topk_bench.errors import NonFinite
from topk_bench.measure import fidelity
from topk_bench.measure.backends import dtype_of, predict
from topk_bench.units import GIB
from topk_bench.workloads import Workload, build

CPU_LIMIT_BYTES = 2 * GIB
MIN_SEQ_LEN = 16


def vanilla_of(case: Case, seq_len: int) -> Case:
    """The same case with vanilla everywhere (attention, and the decoder's FF) at ``seq_len``."""
    params = {**case.param_dict, "seq_len": seq_len}
    return dataclasses.replace(
        case, impl="vanilla", options=(), ff_impl="vanilla" if case.ff_impl is not None else None,
        ff_options=(), params=tuple(sorted(params.items())), fidelity=False,
    )


def at_size(case: Case, seq_len: int) -> Case:
    params = {**case.param_dict, "seq_len": seq_len}
    return dataclasses.replace(case, params=tuple(sorted(params.items())), fidelity=False)


def memory_limit(case: Case, budget: Budget) -> int | None:
    limits = [budget.max_memory_bytes] if budget.max_memory_bytes is not None else []
    if case.device.startswith("cpu"):
        limits.append(CPU_LIMIT_BYTES)
    return min(limits) if limits else None


def choose_seq_len(case: Case, budget: Budget) -> int:
    """The case's ``seq_len``, halved until vanilla's predicted fwd+bwd peak fits the limit."""
    limit = memory_limit(case, budget)
    seq_len = int(case.param_dict["seq_len"])
    if limit is None:
        return seq_len
    while True:
        probe = dataclasses.replace(vanilla_of(case, seq_len), method="predicted", mode="fwd_bwd")
        if predict(probe, Budget()).peak_bytes <= limit:
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
    return {"rel_err": fidelity.rel_err(out, ref_out), "grad_cos": fidelity.grad_cos(grad, ref_grad),
            "fidelity_seq_len": seq_len}


def is_vanilla(case: Case) -> bool:
    return case.impl == "vanilla" and case.ff_impl in (None, "vanilla")


def layer_columns(case: Case, budget: Budget) -> dict[str, Any]:
    seq_len = choose_seq_len(case, budget)
    if is_vanilla(case):  # vanilla against itself, by definition
        return {"rel_err": 0.0, "grad_cos": 1.0, "fidelity_seq_len": seq_len}
    return against_vanilla(case, seq_len)


def extra_columns(case: Case, budget: Budget) -> dict[str, Any]:
    """The optional columns of a case: its workload's own, and layer fidelity when the suite asks (``fidelity = true``).

    Raises NonFinite when one of them is NaN or inf."""
    columns: dict[str, Any] = {}
    own = workloads.get(case.workload).extra_columns
    if own is not None:
        columns.update(own(case, budget))
    if case.fidelity:
        columns.update(layer_columns(case, budget))
    bad = [f"{name} = {value}" for name, value in columns.items()
           if isinstance(value, float) and not math.isfinite(value)]
    if bad:  # readers leave out a row with such a number: the case is nonfinite instead
        raise NonFinite(f"not finite: {', '.join(bad)}")
    return columns
