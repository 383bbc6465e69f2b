"""The authors' benchmark code, reproduced for its memory behaviour.

(ag1988/top_k_attention, ``nocache_attention/``, June 2021.)

The registry's ``vanilla``, ``qchunk`` and ``topk`` are careful implementations of the
paper's methods; the figures of the paper were measured with the authors' code, which
spends memory differently. These three variants do what that code does, written from
its observed behaviour and the paper's pseudo-code (§2.2), so that its numbers can be
reproduced and told apart from the method's:

- ``vanilla_paper``: ``dropout(activation(scale * (q kᵀ masked))) v`` through autograd.
  Causal: the whole ``Lq x Lk`` bool mask is built up front (the authors built it once,
  before their timing loop: pass it as ``mask`` to keep it out of a measured region).
- ``qchunk_paper``: their query chunking, i.e. their top-k function with top-k off.
  Queries in ``torch.chunk(q, Lq // chunk_size)`` pieces (so chunks are *larger* than
  ``chunk_size`` when it does not divide ``Lq``), one ``autograd.Function`` per chunk
  that caches nothing but its inputs: the chunk's queries (gathered by index, a copy,
  as theirs), ``k``, ``v`` and, when masked, the chunk's ``C x Lk`` bool mask (built per
  chunk when causal, gathered from ``mask`` when given). Backward, per chunk, out of
  place: ``d_attn = d_out vᵀ``, recomputed scores, the activation recomputed through
  autograd, and ``d_scores`` - several ``C x Lk`` blocks alive at once, where ``qchunk``
  holds two.
- ``topk_paper``: the pseudo-code of §2.2 in the same chunks; caches the top values and
  indices; the one ``C x Lk`` block of each pass is reused in place (the scores become
  the scattered weights in forward; ``d_attn`` becomes the weights, then ``d_scores``,
  in backward), as their code does.

Common to the three (the authors' protocol):

- ``dropout`` (default 0.1, as every run of theirs) on the attention probabilities, or
  on the ReLU activations of a feed-forward layer, even in forward-only runs. On the
  CPU ``F.dropout`` keeps a float noise tensor, on CUDA a bool mask: as theirs did.
- ``scale``: the scores are multiplied by it inside the activation (their
  ``softmax(x * d**-0.5)``), out of place. 1.0 (the default) means ``q`` is already
  scaled, as everywhere in the registry; then nothing is multiplied, as in their
  feed-forward layer. ``MultiHeadAttention(scale_in_attention=True)`` passes unscaled
  ``q`` and ``scale = head_dim ** -0.5``.
- Masked scores are filled in place with the most negative finite value (theirs), not
  ``-inf``; a softmax row with no allowed key gets zero output (registry convention;
  theirs would average all values), by zeroing that output row. Causal masking is
  bottom-right aligned (registry convention). ``mask``: a precomputed bool mask
  broadcastable to ``[B, H, Lq, Lk]``, True = masked; when given it is the whole mask
  (with ``causal=True`` it must already hold the causal pattern).

Checked against their code, run on the CPU under the same live-bytes tracker: the same
peaks, byte for byte, for a causal BERT-base attention layer (forward + backward, chunk
1024, top-128, dropout 0 and 0.1, L = 1K, 2K, 4K; pinned in tests/attention/test_paper_variants.py),
and to the 0.1 MiB compared for a 3072-wide feed-forward layer.

One defect of theirs is deliberately *not* reproduced: their dropout recorded one RNG
state per layer, overwritten by every chunk's forward, and every chunk's backward
replayed it, so with dropout and more than one chunk the backward used another chunk's
mask and the gradients were wrong. Here each chunk records its own RNG state before
drawing its mask and its backward replays exactly that state (:class:`ChunkRng`); the
memory is the same (a generator state per chunk, off the device).
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
import torch.nn.functional as F

from topk_bench.attention.registry import Implementation, register

ACTIVATIONS = ("softmax", "relu")


class Settings(NamedTuple):
    activation: str
    scale: float
    dropout: float
    topk: int | None  # None: query chunking without top-k
    fill: float  # what masked scores are filled with
    # A softmax row may have no allowed key: its output (and so its gradients) must be zeroed.
    empty_rows: bool = False


def check_args(q, k, v, *, activation, dropout, scale, chunk_size=1, topk=1, mask=None) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be 'softmax' or 'relu', got {activation!r}")
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]) or k.shape[-2] != v.shape[-2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"expected q [*, Lq, d], k [*, Lk, d], v [*, Lk, dv] with equal leading dims (no grouped-query heads), "
            f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    if chunk_size < 1 or topk < 1:
        raise ValueError(f"chunk_size and topk must be >= 1, got chunk_size={chunk_size}, topk={topk}")
    if mask is not None:
        lq, lk = q.shape[-2], k.shape[-2]
        if mask.dtype != torch.bool or mask.dim() < 2 or mask.shape[-2] not in (1, lq) or mask.shape[-1] not in (1, lk):
            raise ValueError(
                f"mask must be bool and broadcastable to [.., {lq}, {lk}], got {mask.dtype} {tuple(mask.shape)}"
            )


def fill_value(dtype: torch.dtype, scale: float) -> float:
    """Their masked score: the most negative finite value, kept finite after the scaling."""
    return torch.finfo(dtype).min / max(scale, 1.0)


def causal_mask(q_start: int, q_len: int, lq: int, lk: int, device) -> torch.Tensor:
    """Bool ``[q_len, lk]``, True where key ``j`` is after query ``q_start + i`` (bottom-right aligned)."""
    rows = torch.arange(q_start + lk - lq, q_start + lk - lq + q_len, device=device).unsqueeze(1)
    return torch.arange(lk, device=device).unsqueeze(0) > rows


def rows_with_a_key(mask: torch.Tensor) -> torch.Tensor:
    """Bool ``[.., rows, 1]``: the query has at least one allowed key (no ``rows x Lk`` temporary)."""
    return mask.all(dim=-1, keepdim=True).logical_not_()


def top_rows_with_a_key(top_dots: torch.Tensor, s: Settings) -> torch.Tensor:
    """:func:`rows_with_a_key` from the top values: a row with an allowed key has one above the fill."""
    return top_dots.amax(dim=-1, keepdim=True) > s.fill


def activate(scores, s: Settings):
    """Their activation module, ``dropout(f(scores * scale))``, out of place (autograd records it when enabled)."""
    if s.scale != 1.0:
        scores = scores * s.scale
    weights = torch.softmax(scores, dim=-1) if s.activation == "softmax" else torch.relu(scores)
    del scores  # the scaled scores die here, before dropout allocates (as in their one-line lambda)
    return F.dropout(weights, s.dropout, training=True) if s.dropout else weights


class ChunkRng:
    """The RNG state one chunk draws its dropout mask from: recorded in forward, replayed in backward.

    One per chunk. (The authors kept one per layer, overwritten by each chunk's forward,
    so every chunk's backward replayed the last chunk's state.) Replaying leaves the
    global RNG as it found it.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.state = None

    def _get(self):
        if self.device.type == "cpu":
            return torch.get_rng_state()
        return torch.get_device_module(self.device.type).get_rng_state(self.device)

    def _set(self, state) -> None:
        if self.device.type == "cpu":
            torch.set_rng_state(state)
        else:
            torch.get_device_module(self.device.type).set_rng_state(state, self.device)

    def record(self) -> None:
        if self.device.type != "meta":  # meta tensors draw nothing
            self.state = self._get()

    @contextlib.contextmanager
    def replay(self):
        if self.state is None:
            yield
            return
        outside = self._get()
        self._set(self.state)
        try:
            yield
        finally:
            self._set(outside)


def new_chunk_rng(device: torch.device) -> ChunkRng:
    """A fresh state holder per chunk (tests swap this for the authors' shared one to show it fails)."""
    return ChunkRng(device)


class PaperChunkFunction(torch.autograd.Function):
    """One query chunk of the authors' no-cache attention; ``settings.topk`` None is their query chunking."""

    @staticmethod
    def forward(ctx, qc, k, v, mask, rng, s):
        dots = qc @ k.transpose(-2, -1)  # [C, Lk]
        if mask is not None:
            dots.masked_fill_(mask, s.fill)
        if s.dropout:
            rng.record()
        if s.topk is None:
            attn = activate(dots, s)  # new [C, Lk] blocks
            del dots
            ctx.save_for_backward(qc, k, v, mask)
            has_key = rows_with_a_key(mask) if s.empty_rows else None
        else:
            top_dots, top_idx = dots.topk(min(s.topk, dots.shape[-1]), dim=-1, sorted=False)
            attn = dots.zero_().scatter_(-1, top_idx, activate(top_dots, s))  # scores are dead: reused
            del dots
            ctx.save_for_backward(qc, k, v, top_dots, top_idx)  # the mask is in the top values
            has_key = top_rows_with_a_key(top_dots, s) if s.empty_rows else None
        ctx.rng, ctx.settings = rng, s
        out = attn @ v
        return out if has_key is None else out.mul_(has_key)

    @staticmethod
    def backward(ctx, d_out):
        rng, s = ctx.rng, ctx.settings
        if s.topk is None:
            qc, k, v, mask = ctx.saved_tensors
            if s.empty_rows:  # recomputed from what is cached anyway: nothing more is kept
                d_out = d_out * rows_with_a_key(mask)
            d_attn = d_out @ v.transpose(-2, -1)  # [C, Lk]
            dots = qc @ k.transpose(-2, -1)  # recomputed [C, Lk]
            if mask is not None:
                dots.masked_fill_(mask, s.fill)
            with torch.enable_grad(), rng.replay():
                dots.requires_grad_()
                attn = activate(dots, s)
            # Through autograd, out of place: d_attn, dots, attn and the activation's own
            # gradients are alive together.
            (d_dots,) = torch.autograd.grad(attn, dots, d_attn)
            del dots, d_attn
            attn = attn.detach()
            dv = attn.transpose(-2, -1) @ d_out
            del attn
        else:
            qc, k, v, top_dots, top_idx = ctx.saved_tensors
            if s.empty_rows:
                d_out = d_out * top_rows_with_a_key(top_dots, s)
            d_attn = d_out @ v.transpose(-2, -1)  # [C, Lk]
            d_top = d_attn.gather(-1, top_idx)  # [C, k]
            with torch.enable_grad(), rng.replay():
                top_dots = top_dots.detach().requires_grad_()
                top_actv = activate(top_dots, s)
            (d_top_dots,) = torch.autograd.grad(top_actv, top_dots, d_top)
            del top_dots, d_top
            # d_attn's block becomes the weights, then d_scores (same positions overwritten).
            attn = d_attn.zero_().scatter_(-1, top_idx, top_actv.detach())
            dv = attn.transpose(-2, -1) @ d_out
            del top_actv
            d_dots = attn.scatter_(-1, top_idx, d_top_dots)
            # d_top_dots lives on to the end (theirs is the .grad of the cached top values).
            del attn, d_attn
        dq = d_dots @ k
        dk = d_dots.transpose(-2, -1) @ qc
        return dq, dk, dv, None, None, None


def chunked_attention(q, k, v, *, causal, activation, chunk_size, dropout, scale, mask, topk):
    """Their loop over query chunks: one autograd node per chunk, rows picked and written back by index.

    The rows of a chunk are ``torch.arange(Lq).chunk(Lq // chunk_size)`` pieces, and, as in
    their code, the chunk's queries (and mask rows) are gathered with that index: copies,
    which the chunk's node caches as its inputs; each output is written into a zero
    tensor by the same index. (With views instead, peaks came out a few MiB lower.)
    """
    lq, lk = q.shape[-2], k.shape[-2]
    # Empty rows: any with a given mask; with the causal one only when there are more queries than keys.
    empty_rows = activation == "softmax" and (mask is not None or (causal and lq > lk))
    s = Settings(activation, float(scale), float(dropout), topk, fill_value(q.dtype, scale), empty_rows)
    out = q.new_zeros(*q.shape[:-1], v.shape[-1])
    start = 0
    for ids in torch.arange(lq, device=q.device).chunk(max(1, lq // chunk_size)):
        c = ids.shape[0]
        if mask is not None:
            mask_c = mask if mask.shape[-2] == 1 else mask[..., ids, :]
        elif causal:
            mask_c = causal_mask(start, c, lq, lk, q.device)  # built per chunk, as theirs
        else:
            mask_c = None
        out[..., ids, :] = PaperChunkFunction.apply(q[..., ids, :], k, v, mask_c, new_chunk_rng(q.device), s)
        start += c
    return out


def qchunk_paper_attention(
    q, k, v, *, causal=False, activation="softmax", chunk_size=1024, dropout=0.1, scale=1.0, mask=None
):
    """The authors' query chunking (their top-k function with top-k off): caches the inputs only."""
    check_args(q, k, v, activation=activation, dropout=dropout, scale=scale, chunk_size=chunk_size, mask=mask)
    return chunked_attention(
        q,
        k,
        v,
        causal=causal,
        activation=activation,
        chunk_size=int(chunk_size),
        dropout=dropout,
        scale=scale,
        mask=mask,
        topk=None,
    )


def topk_paper_attention(
    q, k, v, *, causal=False, activation="softmax", topk=128, chunk_size=1024, dropout=0.1, scale=1.0, mask=None
):
    """The authors' top-k attention (paper §2.2 pseudo-code) in their query chunks."""
    check_args(
        q, k, v, activation=activation, dropout=dropout, scale=scale, chunk_size=chunk_size, topk=topk, mask=mask
    )
    return chunked_attention(
        q,
        k,
        v,
        causal=causal,
        activation=activation,
        chunk_size=int(chunk_size),
        dropout=dropout,
        scale=scale,
        mask=mask,
        topk=int(topk),
    )


def vanilla_paper_attention(q, k, v, *, causal=False, activation="softmax", dropout=0.1, scale=1.0, mask=None):
    """The authors' vanilla attention: all ``Lq x Lk`` scores, masked in place, then their activation."""
    check_args(q, k, v, activation=activation, dropout=dropout, scale=scale, mask=mask)
    lq, lk = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1)
    full = mask if mask is not None else (causal_mask(0, lq, lq, lk, q.device) if causal else None)
    if full is not None:
        scores.masked_fill_(full, fill_value(scores.dtype, scale))
    s = Settings(activation, float(scale), float(dropout), None, 0.0)
    out = activate(scores, s) @ v
    # A softmax row with no allowed key: zero output (and so zero gradients), not their average.
    if activation == "softmax" and (mask is not None or (causal and lq > lk)):
        out = out * rows_with_a_key(full)
    return out


PAPER_OPTIONS = {"dropout": 0.1, "scale": 1.0, "mask": None}

VANILLA_PAPER = register(
    Implementation(
        name="vanilla_paper",
        fn=vanilla_paper_attention,
        description="the authors' benchmark vanilla: dense scores, full causal mask, scale + softmax + dropout 0.1 "
        "through autograd",
        options=dict(PAPER_OPTIONS),
        label="Vanilla, paper code",
    )
)

QCHUNK_PAPER = register(
    Implementation(
        name="qchunk_paper",
        fn=qchunk_paper_attention,
        description="the authors' query chunking: one autograd node per torch.chunk piece, caches inputs, "
        "out-of-place backward through autograd (several C x Lk blocks), dropout 0.1",
        options={"chunk_size": 1024, **PAPER_OPTIONS},
        label="Q-chunking, paper code (size={chunk_size})",
    )
)

TOPK_PAPER = register(
    Implementation(
        name="topk_paper",
        fn=topk_paper_attention,
        description="the authors' top-k (§2.2 pseudo-code) in their query chunks: caches top values + indices, "
        "dropout 0.1",
        options={"topk": 128, "chunk_size": 1024, **PAPER_OPTIONS},
        label="Top-k, paper code (size={chunk_size}, topk={topk})",
        exact=False,
    )
)
