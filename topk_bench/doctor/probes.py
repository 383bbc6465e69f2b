"""Attention "implementations" that probe the harness, registered when this module is imported.

Only the doctor imports it (in its own process, and in a child through ``Case.plugins``),
so ``topk-bench list`` and suites never see them. Each returns ``q`` (plus nothing) so
that the layer around it runs forward and backward as usual.
"""

from __future__ import annotations

import torch

from topk_bench import attention
from topk_bench.attention import Implementation

MODULE = __name__  # what a Case's ``plugins`` names


def allocate(q, k, v, *, causal=False, activation="softmax", nbytes=0):
    """Asks the device's allocator for ``nbytes`` (and touches them) beside the output."""
    ballast = torch.ones(nbytes, dtype=torch.uint8, device=q.device)
    return q + ballast[:1].to(q.dtype)


# Numerics settings seen inside the measured region, one dict per call (the doctor reads the last).
SEEN: list[dict[str, object]] = []


def numerics(q, k, v, *, causal=False, activation="softmax"):
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    SEEN.append(
        {
            "matmul.allow_tf32": matmul.allow_tf32,
            "cudnn.allow_tf32": cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
        }
    )
    return q.clone()


def work(q, k, v, *, causal=False, activation="softmax", matmuls=1, size=256):
    """A fixed amount of work: ``matmuls`` products of ``size x size`` matrices, in sequence."""
    a = torch.full((size, size), 1.0 / size, dtype=q.dtype, device=q.device)
    x = a
    for _ in range(matmuls):
        x = x @ a
    return q + x[0, 0] * 0


_PROBES = [
    Implementation("doctor_allocate", allocate, "doctor: allocates nbytes", options={"nbytes": 0}, predictable=False),
    Implementation("doctor_numerics", numerics, "doctor: records TF32 settings", predictable=False),
    Implementation(
        "doctor_work", work, "doctor: a fixed number of matmuls", options={"matmuls": 1, "size": 256}, predictable=False
    ),
]

NAMES = frozenset(p.name for p in _PROBES)

for _probe in _PROBES:
    if _probe.name not in attention.names():  # idempotent: the parent and a child both import it
        attention.register(_probe)
