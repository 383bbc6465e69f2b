"""The registry of attention implementations.

An implementation is a plain function

    fn(q, k, v, *, causal=False, activation="softmax", **options) -> out

with ``q [B, Hq, Lq, d]``, ``k, v [B, Hkv, Lk, d]`` and ``out [B, Hq, Lq, dv]``. The
caller scales ``q`` by ``1/sqrt(d)`` (as in the paper).

Conventions every entry follows:

- Causal masking is bottom-right aligned (as FlashAttention >= 2.1 and a KV cache):
  query ``i`` sits at position ``Lk - Lq + i`` and may attend key ``j`` iff
  ``j <= Lk - Lq + i``. With ``Lq == Lk`` this is the usual ``j <= i``; with one
  new token at the end of a cache of ``Lk - 1`` it attends every key. A query row
  with no allowed key gives zeros, never NaN.
- Grouped-query attention: ``Hq`` is a multiple of ``Hkv`` and query head ``h``
  reads key/value head ``h // (Hq // Hkv)`` (``repeat_interleave`` order, as
  ``scaled_dot_product_attention(enable_gqa=True)``). ``gqa`` says how an entry
  handles ``Hkv < Hq``: ``"native"`` without materialising repeated K/V,
  ``"repeats"`` by repeating them (extra memory), ``None`` not at all (the
  harness then records the case ``unsupported``, never runs it).
- Masks: a boolean mask is True where a query may attend a key (as the boolean
  ``attn_mask`` of ``scaled_dot_product_attention``), in every helper and selection
  (:mod:`topk_bench.attention.shared.masking` holds the one set of mask, position, grouping and
  softmax helpers). The ``key_padding_mask`` option is the exception users know from
  ``nn.MultiheadAttention``: bool ``[B, Lk]``, True marks a padding key; it is converted
  once where it enters (:func:`topk_bench.attention.shared.masking.from_padding`).
- Half precision (``float16``, ``bfloat16``): outputs in the input dtype; scores,
  row-wise selection and softmax statistics in float32 where rounding would
  change the result (which keys win a top-k, a softmax's normaliser).

Besides the function, each entry describes itself (options and their defaults,
legend label, supported activations, causal support, exactness) so that the
harness can validate suites and draw legends without special cases.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

AttentionFn = Callable[..., torch.Tensor]

ACTIVATIONS = ("softmax", "relu")


class UnknownImplementation(KeyError):
    """Raised by :func:`get` for a name that is not registered."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return self.args[0]


@dataclass(frozen=True)
class Implementation:
    name: str
    fn: AttentionFn
    description: str
    # Option name -> default value. Only these options may be passed.
    options: Mapping[str, Any] = field(default_factory=dict)
    # Legend in the paper's style; formatted with the options, e.g.
    # "Q-chunking (size={chunk_size})".
    label: str = ""
    activations: tuple[str, ...] = ACTIVATIONS
    causal: bool = True
    exact: bool = True
    # Covering every key (its budget options at the sequence length) makes it exact attention, as for top-k; False
    # for a method that changes the attention even then (NSA's gated compressed branch).
    exact_when_covering: bool = True
    # Its ``topk`` option keeps each query's largest attention scores; False where it ranks keys by something else
    # (DSA's indexer), so that a top-k oracle of the scores cannot judge which keys it keeps.
    topk_of_scores: bool = True
    key_padding_mask: bool = False
    # Runs under FakeTensorMode (no data-dependent ops), so the predict backend can size it.
    predictable: bool = True
    # How grouped-query inputs (fewer K/V heads than query heads) are handled; see the module doc.
    gqa: str | None = None
    # Selection methods (top-k, page top-k, sink + window, block top-k): which keys each query
    # attends to, ``selection(q, k, *, causal, **options) -> bool [B, Hq, Lq, Lk]`` (True =
    # attended), for the selection-quality metrics. Same options as ``fn``. None: dense or not
    # a selection (Performer).
    selection: Callable[..., torch.Tensor] | None = None
    # Selection methods: the options that make the method attend ``tokens`` keys per query besides
    # its own page or block (``budget(tokens, options) -> options to override``), so that one token
    # budget sweeps top-k's k, page top-k's token_budget, the window and the number of blocks alike.
    budget: Callable[[int, Mapping[str, Any]], dict[str, Any]] | None = None
    # What the method keeps with a KV cache besides K and V, built once per cache (not per step):
    # ``cache_state(k, v, options) -> options to add`` (page top-k's page summaries and block top-k's block means,
    # from K; NSA's compressed keys and values, from both). None: nothing.
    cache_state: Callable[[torch.Tensor, torch.Tensor, Mapping[str, Any]], dict[str, Any]] | None = None
    # Compiles on its first call for each shape (torch.compile: flex): the harness keeps that call out of
    # the timed region and reports its seconds (``compile_s``).
    compiles: bool = False
    # What the machine decides of the code it runs (topk_bench.attention.provenance: "native_kernels", "half_products",
    # "decode_tiles"): what a row records beside its case, so that two rows of one case from different code differ.
    machine_choices: tuple[str, ...] = ()
    # The stages it marks with topk_bench.attention.shared.stages.stage (indexer, selection, attention...): what the
    # harness
    # measures per stage, and which rows carry per-stage columns. Empty: it marks none.
    stages: tuple[str, ...] = ()
    # Builds the per-layer attention module (for implementations with per-layer
    # state such as Performer's random features). ``None``: a stateless wrapper.
    module_factory: Callable[..., torch.nn.Module] | None = None

    def resolve(self, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Defaults overlaid with ``options``; unknown options raise ``TypeError``."""
        options = dict(options or {})
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            known = ", ".join(sorted(self.options)) or "none"
            raise TypeError(f"implementation {self.name!r} has no option {unknown[0]!r} (options: {known})")
        return {**self.options, **options}

    def legend(self, options: Mapping[str, Any] | None = None) -> str:
        return (self.label or self.name).format(**self.resolve(options))

    def module(self, head_dim: int, **options: Any) -> torch.nn.Module:
        """The attention as an ``nn.Module`` called as ``module(q, k, v, causal=..., activation=...)``; a call
        whose output breaks the contract (shape, dtype, device) raises ``ValueError``."""
        resolved = self.resolve(options)
        if self.module_factory is not None:
            module = self.module_factory(head_dim=head_dim, **resolved)
        else:
            module = AttentionModule(self.fn, resolved)
        module.register_forward_hook(_OutputCheck(self.name), with_kwargs=True)  # no wrapper: state names stay
        return module


class _OutputCheck:
    """A forward hook: the output is ``[B, Hq, Lq, dv]`` (``q``'s shape but ``v``'s last dimension), in ``q``'s
    dtype, on ``q``'s device. A wrong one would otherwise be timed and sized as if it were attention."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, module, args, kwargs, out) -> None:
        if len(args) < 3:
            return
        q, v = args[0], args[2]
        expected = [*q.shape[:-1], v.shape[-1]]
        if (
            isinstance(out, torch.Tensor)
            and list(out.shape) == expected
            and out.dtype == q.dtype
            and out.device == q.device
        ):
            return
        got = (
            f"shape {list(out.shape)}, {out.dtype}, on {out.device}"
            if isinstance(out, torch.Tensor)
            else type(out).__name__
        )
        raise ValueError(f"implementation {self.name!r} returned {got}; expected {expected}, {q.dtype}, on {q.device}")


class AttentionModule(torch.nn.Module):
    """A stateless attention function bound to its options."""

    def __init__(self, fn: AttentionFn, options: Mapping[str, Any]):
        super().__init__()
        self.fn = fn
        self.options = dict(options)

    def forward(self, q, k, v, *, causal: bool = False, activation: str = "softmax", **extra):
        return self.fn(q, k, v, causal=causal, activation=activation, **self.options, **extra)


_REGISTRY: dict[str, Implementation] = {}

# Keyword parameters of every attention function that are the call's, not options.
CALL_PARAMETERS = ("causal", "activation")


def signature_options(fn: Callable[..., Any], *, exclude: Iterable[str] = ()) -> Mapping[str, Any]:
    """The options ``fn`` declares, as ``options``: its keyword-only parameters with their defaults, but
    :data:`CALL_PARAMETERS` and ``exclude`` (hooks of a direct call, such as DSA's ``loss_out``). For an entry whose
    defaults its function's signature writes, once."""
    skipped = {*CALL_PARAMETERS, *exclude}
    return MappingProxyType(
        {
            name: p.default
            for name, p in inspect.signature(fn).parameters.items()
            if p.kind == p.KEYWORD_ONLY and p.default is not p.empty and name not in skipped
        }
    )


def option_mismatches(impl: Implementation) -> list[str]:
    """Where ``impl.options`` and its functions' signatures disagree: an option ``fn`` does not take (unless it takes
    ``**options``), or a default ``fn`` or ``selection`` declares that is not the option's."""
    problems = []
    for what, fn in (("fn", impl.fn), ("selection", impl.selection)):
        if fn is None:
            continue
        parameters = inspect.signature(fn).parameters
        takes_any = any(p.kind == p.VAR_KEYWORD for p in parameters.values())
        for name, default in impl.options.items():
            p = parameters.get(name)
            if p is None:
                if what == "fn" and not takes_any:
                    problems.append(f"option {name!r} is no parameter of {fn.__qualname__}")
            elif p.default is not p.empty and not (p.default is default or p.default == default):
                problems.append(f"option {name!r} defaults to {default!r}, {fn.__qualname__}'s {name} to {p.default!r}")
    return problems


def register(impl: Implementation) -> Implementation:
    """Add ``impl`` to the registry; a ``ValueError`` for a name already taken, or for options that its functions'
    signatures contradict (:func:`option_mismatches`)."""
    if impl.name in _REGISTRY:
        raise ValueError(f"implementation {impl.name!r} is already registered")
    problems = option_mismatches(impl)
    if problems:
        raise ValueError(f"implementation {impl.name!r}: " + "; ".join(problems))
    _REGISTRY[impl.name] = impl
    return impl


def spec(name: str) -> Implementation:
    """The registry entry for ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise UnknownImplementation(f"unknown implementation {name!r} (known: {known})") from None


def get(name: str) -> AttentionFn:
    """The attention function registered under ``name``."""
    return spec(name).fn


def names() -> list[str]:
    return sorted(_REGISTRY)


def all_specs() -> list[Implementation]:
    return [_REGISTRY[n] for n in names()]
