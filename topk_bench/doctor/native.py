"""The compiled kernels (topk_bench.attention.kernels.native): built here, agreeing with torch.topk and torch.sort, and
which
code a run would take on this machine (topk_bench.attention.provenance)."""

from __future__ import annotations

import torch

from topk_bench.attention import provenance
from topk_bench.attention.kernels import native
from topk_bench.doctor.check import Check, Result

# Rows of the agreement check: a few of each path of the kernel (ties, a k of one, NaN, a wide row).
_K = (1, 8, 64)


def _agreement() -> str:
    """Why the kernels disagree with torch on a few rows ("" when they agree)."""
    generator = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        scores = torch.randn(2, 5, 4096, generator=generator, dtype=dtype)
        scores[0, 0, :64] = 1.0  # ties at the k-th value
        scores[1, 1, 7] = float("nan")  # NaN ranks highest, as torch.topk's
        for k in _K:
            values = torch.empty(2, 5, k, dtype=dtype)
            indices = torch.empty(2, 5, k, dtype=torch.int64)
            native.row_topk_(scores, k, values, indices)
            expected = torch.topk(scores, k, dim=-1).values.sort(dim=-1).values
            got = values.sort(dim=-1).values
            if not torch.equal(got.nan_to_num(7.0), expected.nan_to_num(7.0)):
                return f"row_topk_ {dtype} k={k}: values differ from torch.topk's"
            if not torch.equal(torch.gather(scores, -1, indices).nan_to_num(7.0), values.nan_to_num(7.0)):
                return f"row_topk_ {dtype} k={k}: indices do not point at the values"
    keys = torch.randint(0, 50, (10_000,), generator=generator)
    rows, starts = torch.empty(10_000, dtype=torch.int64), torch.empty(51, dtype=torch.int64)
    native.key_sort_(keys, 0, 7, rows, starts)
    order = torch.sort(keys, stable=True).indices
    if not torch.equal(rows, order // 7) or not torch.equal(starts, torch.searchsorted(keys[order], torch.arange(51))):
        return "key_sort_: entries not in torch.sort's stable order"
    return ""


def checks(device: str) -> list[Check]:
    """The kernels (built and agreeing, or why not: a skip, the torch path being exact too) and the code a run of
    topk_fast would take on ``device`` in float32 and bfloat16."""
    status = native.status()
    if not status.built:
        kernels = Check("compiled kernels", Result.SKIPPED, f"not used here: {status.reason}; topk_fast runs torch's")
    else:
        problem = _agreement()
        levels = native.filter_levels()
        kernels = Check.judged(
            "compiled kernels",
            not problem,
            problem
            or f"built {status.key} (row top-k filter: {levels['32-bit']}, 16-bit scores {levels['16-bit']}); "
            "row_topk_ agrees with torch.topk, key_sort_ with torch.sort",
        )
    paths = "; ".join(
        f"{dtype}: {provenance.code_path('topk_fast', device=device, dtype=getattr(torch, dtype)) or 'nothing'}"
        for dtype in ("float32", "bfloat16")
    )
    return [kernels, Check("code path (topk_fast)", Result.PASS, paths)]
