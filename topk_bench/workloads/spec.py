"""What a case runs: the model and its random inputs, built from the case's workload and parameters.

``WORKLOADS`` maps a workload name to a builder ``(case, device, dtype) -> Workload``;
a new workload is one more builder registered with :func:`workload`.
The input requires grad: the layer is measured as it sits inside a network,
where backward also produces the gradient of its input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from implementations import Decoder, FeedForward, MultiHeadAttention
from topk_bench.case import Case

# BERT-base, as the paper (§3): the defaults of every shape parameter.
DEFAULT_PARAMS = {"d_model": 768, "heads": 12, "d_ff": 3072, "batch": 1, "layers": 12}


@dataclass
class Workload:
    model: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]

    def __call__(self) -> torch.Tensor:
        return self.model(*self.inputs)

    def clear_grads(self) -> None:
        """Drop gradients of a previous iteration so that every iteration starts from the same live set."""
        for p in self.model.parameters():
            p.grad = None
        for x in self.inputs:
            x.grad = None


Builder = Callable[[Case, torch.device, torch.dtype], Workload]
WORKLOADS: dict[str, Builder] = {}


def workload(name: str) -> Callable[[Builder], Builder]:
    def register(builder: Builder) -> Builder:
        WORKLOADS[name] = builder
        return builder
    return register


def shape(case: Case, allowed: tuple[str, ...], required: tuple[str, ...] = ("seq_len",)) -> dict[str, Any]:
    """The case's shape parameters over the defaults; unknown or missing ones raise ``ValueError``."""
    params = case.param_dict
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(f"workload {case.workload!r} has no parameter {unknown[0]!r} (parameters: {', '.join(allowed)})")
    missing = [name for name in required if name not in params]
    if missing:
        raise ValueError(f"workload {case.workload!r} needs parameter {missing[0]!r}")
    return {**{k: v for k, v in DEFAULT_PARAMS.items() if k in allowed}, **params}


def hidden_states(p: dict[str, Any], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(p["batch"], p["seq_len"], p["d_model"], device=device, dtype=dtype, requires_grad=True)


@workload("mha")
def build_mha(case: Case, device: torch.device, dtype: torch.dtype) -> Workload:
    p = shape(case, ("seq_len", "d_model", "heads", "batch"))
    model = MultiHeadAttention(
        p["d_model"], p["heads"], case.impl, causal=case.causal, activation=case.activation, **case.option_dict,
    )
    return Workload(model, (hidden_states(p, device, dtype),))


@workload("ff")
def build_ff(case: Case, device: torch.device, dtype: torch.dtype) -> Workload:
    """The feed-forward layer as attention (ReLU, no mask): ``batch x seq_len`` tokens are its queries."""
    p = shape(case, ("seq_len", "d_model", "d_ff", "batch"))
    model = FeedForward(p["d_model"], p["d_ff"], case.impl, **case.option_dict)
    return Workload(model, (hidden_states(p, device, dtype),))


@workload("decoder")
def build_decoder(case: Case, device: torch.device, dtype: torch.dtype) -> Workload:
    """Causal post-LN decoder; ``case.impl`` at attention, ``case.ff_impl`` (default vanilla) at feed-forward."""
    p = shape(case, ("seq_len", "d_model", "heads", "d_ff", "batch", "layers"))
    model = Decoder(
        p["layers"], p["d_model"], p["heads"], p["d_ff"],
        attention=case.impl, feedforward=case.ff_impl or "vanilla",
        attention_options=case.option_dict, feedforward_options=case.ff_option_dict,
    )
    return Workload(model, (hidden_states(p, device, dtype),))


@workload("pretrained")
def build_pretrained(case: Case, device: torch.device, dtype: torch.dtype) -> Workload:
    """all-MiniLM-L6-v2 encoding the shipped corpus, sublayers replaced (needs the 'pretrained' extra)."""
    from topk_bench import pretrained_workload  # imports transformers: only when asked for

    return pretrained_workload.build(case, device, dtype)


def build(case: Case, device: torch.device | str, dtype: torch.dtype) -> Workload:
    """Seeded from ``case.seed``: the same case always gets the same weights and inputs."""
    try:
        builder = WORKLOADS[case.workload]
    except KeyError:
        raise ValueError(f"unknown workload {case.workload!r} (known: {', '.join(sorted(WORKLOADS))})") from None
    torch.manual_seed(case.seed)
    # Built directly on the device in the dtype (no ``.to()`` copy, which FakeTensorMode refuses).
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return builder(case, torch.device(device), dtype)
    finally:
        torch.set_default_dtype(previous)
