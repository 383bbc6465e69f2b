"""Performer (FAVOR+) through performer-pytorch, with a causal path linear in memory.

Non-causal: the package's ``softmax_kernel`` feature maps and ``linear_attention``.

Causal: the package (without fast-transformers' CUDA kernel) falls back to a path
that stores ``B*H*L*m*d`` floats, and its key feature map subtracts a max over the
whole sequence (with its ``eps``, a future key changes earlier outputs). Here:
queries keep the package's map (its stabiliser is per query), keys use the same
map with a data-independent stabiliser ``max_r |w_r|^2 / 2`` (an upper bound of
every exponent ``w_r.y - |y|^2/2``, so ``exp`` cannot overflow) and no ``eps``,
and the product is :func:`~topk_bench.attention.shared.causal_product.causal_product`.
Each output then depends on keys/values ``j <= i`` only.

Random features: the package's Gaussian orthogonal matrix, drawn here on the CPU with
torch's RNG (reproducible under ``torch.manual_seed``) and placed on the model's device,
once per layer by :class:`PerformerAttention` (held as a buffer); the bare function
draws per call, on the inputs' device.

- Causal: bottom-right aligned. With ``Lq < Lk`` the first ``Lk - Lq`` keys are a
  prefix every query sees: their ``sum_j phi(k_j)ᵀ [v_j, 1]`` starts the prefix sums of
  the last ``Lq`` keys. With ``Lq > Lk`` the first ``Lq - Lk`` rows (no key) are zeros
  and the rest is the square problem.
- Grouped-query heads (native): key features are computed once per K/V head.
  Non-causal: the G query heads of a group are folded into the rows of their K/V
  head (``[*, Hkv, G*Lq, m]``) for the package's ``linear_attention``. Causal: one
  prefix-sum scan per group member, each on the K/V heads' features as they are.
- Half precision: computed in float32 (inputs, features, prefix-sum states and the
  normaliser), output in the input dtype: exponentials of features and sums over
  the whole sequence are where half precision would change the result.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from topk_bench.attention.registry import Implementation, register
from topk_bench.attention.shared.causal_product import causal_product
from topk_bench.attention.shared.masking import (
    check_activation,
    check_qkv,
    fold_groups,
    stat_dtype,
    unfold_groups,
    upcast,
)


def _package():
    # Imported lazily: performer-pytorch pulls in extra modules and warns about distutils.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import distutils  # noqa: F401 -- only whether it imports
        except ModuleNotFoundError:
            # performer-pytorch reads distutils.version, gone from the standard library since Python 3.12;
            # setuptools provides it once imported (where its start-up hook did not run: an environment
            # that sees another's site-packages through a plain path).
            import setuptools  # noqa: F401 -- importing it provides distutils
        import performer_pytorch.performer_pytorch as pp
    return pp


def draw_projection(nb_features: int, head_dim: int, device=None) -> torch.Tensor:
    """The package's Gaussian orthogonal random features ``[nb_features, head_dim]``, on ``device``.

    The same draws as the package's ``gaussian_orthogonal_random_matrix(scaling=0)`` (QR
    blocks, then row norms of a Gaussian matrix), always made on the CPU with torch's
    global RNG: reproducible under ``torch.manual_seed`` and the same values whatever the
    device (QR runs on the CPU anyway; a meta tensor has no values to draw). Then moved
    to ``device``, by default the current default device (the ``with torch.device(...)``
    a model is built under). The package's own function takes its QR blocks back to the
    CPU but draws the norms on the default device, and fails there.

    In the default dtype, or float32 when that is a half type (a layer built in bfloat16:
    the CPU has no half-precision QR, and the features are computed in float32 anyway).
    """
    cpu = torch.device("cpu")
    dtype = torch.get_default_dtype()
    dtype = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    blocks = []
    for _ in range(-(-nb_features // head_dim)):
        q, _ = torch.linalg.qr(torch.randn(head_dim, head_dim, device=cpu, dtype=dtype), mode="reduced")
        blocks.append(q.t())
    matrix = torch.cat(blocks)[:nb_features]
    multiplier = torch.randn(nb_features, head_dim, device=cpu, dtype=dtype).norm(dim=1)
    # The package's diag(multiplier) @ matrix, bit for bit (each row scaled; the product only adds exact zeros),
    # without a matrix product: a GEMM here would be the only one of the build.
    projection = multiplier.unsqueeze(1) * matrix
    return projection.to(torch.get_default_device() if device is None else device)


def causal_key_features(k: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
    """The package's positive softmax features of keys with a stabiliser that sees no other key."""
    d = k.shape[-1]
    normalizer = d**-0.25
    ratio = projection.shape[0] ** -0.5
    dash = (normalizer * k) @ projection.t()  # [.., L, m]
    diag = (k * k).sum(dim=-1, keepdim=True) * (normalizer**2 / 2)
    # w.y - |y|^2/2 <= |w|^2/2 for every y: the largest exponent is at most 0.
    bound = (projection * projection).sum(dim=-1).amax() / 2
    return ratio * torch.exp(dash - diag - bound)


def performer_attention(
    q, k, v, *, causal=False, activation="softmax", nb_features=256, chunk_size=512, projection=None
):
    """FAVOR+ estimate of ``softmax(q kᵀ) v`` (``q`` already scaled by ``1/sqrt(d)``).

    ``chunk_size``: positions per step of the causal prefix sum (a ``C x C`` matrix per
    head and step; larger chunks mean fewer Python steps).
    ``projection``: the random features ``[nb_features, d]``; drawn here when ``None``.
    """
    check_activation(activation, "performer", ("softmax",))  # FAVOR+ approximates softmax attention
    groups = check_qkv(q, k, v)
    dtype = q.dtype
    q, k, v = upcast(q), upcast(k), upcast(v)  # half inputs: everything in float32 (see module doc)
    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    if projection is None:
        projection = draw_projection(nb_features, d, device=q.device).to(q.dtype)
    if causal and lq > lk:
        # The first lq - lk rows sit before every key: zeros (and zero gradients), not 0/0.
        out = performer_attention(q[..., lq - lk :, :], k, v, causal=True, chunk_size=chunk_size, projection=projection)
        return F.pad(out, (0, 0, lq - lk, 0)).to(dtype)
    pp = _package()
    # The package scales q and k by d^-1/4 each, expecting unscaled q: undo the caller's 1/sqrt(d).
    q_features = pp.softmax_kernel(q * math.sqrt(d), projection_matrix=projection, is_query=True)
    if not causal:
        k_features = pp.softmax_kernel(k, projection_matrix=projection, is_query=False)
        out = pp.linear_attention(fold_groups(q_features, groups), k_features, v)
        return unfold_groups(out, groups).to(dtype)
    k_features = causal_key_features(k, projection.to(k.dtype))
    # A column of ones in the values gives the normaliser sum_{j<=i} phi(q_i).phi(k_j) in the same scan.
    ones = v.new_ones(*v.shape[:-1], 1)
    values = torch.cat([v, ones], dim=-1)
    prefix = lk - lq  # keys every query sees (bottom-right alignment)
    if prefix:
        state = k_features[..., :prefix, :].transpose(-2, -1) @ values[..., :prefix, :]  # [*, Hkv, m, dv + 1]
        k_features, values = k_features[..., prefix:, :], values[..., prefix:, :]
    if groups == 1:
        both = causal_product(q_features, k_features, values, chunk_size)
    else:
        members = q_features.unflatten(-3, (-1, groups))  # [*, Hkv, G, Lq, m]
        both = torch.stack(
            [causal_product(members[..., j, :, :], k_features, values, chunk_size) for j in range(groups)], dim=-3
        ).flatten(-4, -3)
    del ones
    if prefix:
        both = both + unfold_groups(fold_groups(q_features, groups) @ state, groups)
    num, den = both[..., :-1], both[..., -1:]
    return (num / den.clamp_min(torch.finfo(den.dtype).tiny)).to(dtype)


class PerformerAttention(nn.Module):
    """Performer attention of one layer: its random features are drawn once, at construction."""

    def __init__(self, head_dim: int, nb_features: int = 256, chunk_size: int = 512):
        super().__init__()
        self.nb_features = nb_features
        self.chunk_size = chunk_size
        self.register_buffer("projection", draw_projection(nb_features, head_dim))

    def forward(self, q, k, v, *, causal=False, activation="softmax"):
        return performer_attention(
            q,
            k,
            v,
            causal=causal,
            activation=activation,
            nb_features=self.nb_features,
            chunk_size=self.chunk_size,
            projection=self.projection.to(stat_dtype(q.dtype)),
        )


PERFORMER = register(
    Implementation(
        name="performer",
        fn=performer_attention,
        description="FAVOR+ (performer-pytorch feature maps); causal by chunked prefix sums, memory linear in L",
        options={"nb_features": 256, "chunk_size": 512},
        label="Performer (features={nb_features})",
        activations=("softmax",),
        exact=False,
        module_factory=PerformerAttention,
        gqa="native",
    )
)
