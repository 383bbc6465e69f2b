"""Benchmark protocols: ``ours`` (the default) or ``paper``, a suite's ``protocol`` key.

``paper`` is the authors' benchmark (ag1988/top_k_attention, ``nocache_attention/benchmarking_*.py``,
with the paper's appendix "Benchmarking details"), so that the paper's numbers can be reproduced and
told apart from the methods'. Each part of it is applied in one place:

- layers (:mod:`topk_bench.workloads.protocol`): attention scores scaled by ``head_dim ** -0.5``
  inside the activation, where the implementation has a ``scale`` option (the paper variants);
  a causal ``vanilla_paper`` gets the whole ``L x L`` bool mask, built with the model before the
  measured region and alive through it (counted in ``baseline_bytes``);
- dropout: the paper variants' own default, 0.1, as in every run of theirs;
- iterations (:mod:`topk_bench.measure.iterations`): no warm-up, the first, cold iteration is timed;
  each of the 3 timed iterations runs on a model and inputs built just before it, outside the
  timed region; peaks are never reset;
- statistics (:func:`drawn_metric`): a figure's time is the mean of the 3, and, measured on CUDA,
  its memory is ``max_memory_reserved`` (the paper's metric).

This module is the vocabulary only; it imports nothing of the harness but its words (:mod:`topk_bench.types`).
"""

from __future__ import annotations

from dataclasses import dataclass

from topk_bench.types import DeviceKind, Method


@dataclass(frozen=True)
class Protocol:
    name: str
    # Fixed by the protocol; None: bench.toml, the suite or the flags decide.
    warmup: int | None = None
    repeats: int | None = None
    warmup_s: float | None = None
    min_sample_s: float | None = None
    timer: str | None = None
    flush_l2: bool | None = None
    # Cases may compile their attention (torch.compile once, before the timed iterations).
    compiles: bool = True
    # The metrics a figure draws for "time", and for "memory" of a row measured on CUDA.
    time_metric: str = "time"
    cuda_memory_metric: str = "memory"
    # Implementation options the protocol sets itself: a suite may not, and cases leave them out
    # (their CSV columns stay empty rather than show a default the layer replaces).
    owned_options: tuple[str, ...] = ()

    def fixed_value_problem(self, setting: str, value: object) -> str | None:
        """Why ``value`` of ``setting`` (``warmup``, ``repeats``, ``warmup_s``, ``min_sample_s``, ``timer``,
        ``flush_l2``) contradicts this protocol, or None."""
        fixed = getattr(self, setting)
        if value is None or fixed is None or value == fixed:
            return None
        return (
            f"protocol {self.name!r} fixes {setting} = {fixed} ({_WHY_FIXED[setting]}), got {value}: "
            f"leave it out, or set protocol = {DEFAULT!r}"
        )


OURS = Protocol("ours")
# Their loop: `for i in range(args.n_iters)` (3), every iteration timed, max_memory_reserved, np.mean(times).
# Their timer: synchronise, time.time() around the eager iteration, no cache flush; a model per timed iteration
# (so nothing compiled once could serve the next).
PAPER = Protocol(
    "paper",
    warmup=0,
    repeats=3,
    warmup_s=0.0,
    min_sample_s=0.0,
    timer="events",
    flush_l2=False,
    compiles=False,
    time_metric="time_mean",
    cuda_memory_metric="reserved",
    owned_options=("scale", "mask"),
)
PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (OURS, PAPER)}
DEFAULT = OURS.name


def lookup(name: str) -> Protocol:
    try:
        return PROTOCOLS[name]
    except KeyError:
        raise ValueError(f"unknown protocol {name!r} (known: {', '.join(PROTOCOLS)})") from None


_WHY_FIXED = {
    "warmup": "the first, cold iteration is timed",
    "repeats": "the time is the mean of 3 runs",
    "warmup_s": "the first, cold iteration is timed",
    "min_sample_s": "each timed iteration runs alone, on a model built for it",
    "timer": "each eager iteration is timed as theirs was",
    "flush_l2": "theirs flushed no cache",
}


def drawn_metric(metric: str, protocol: str, device: str, method: str) -> str:
    """The metric a figure draws for ``metric`` in rows of ``protocol`` on ``device`` by ``method``."""
    p = lookup(protocol)
    if metric == "time":
        return p.time_metric
    if metric == "memory" and method == Method.MEASURED and DeviceKind.read(device) is DeviceKind.CUDA:
        return p.cuda_memory_metric
    return metric
