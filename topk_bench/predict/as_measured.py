"""The code path a committed measurement ran, as the environment that makes the implementations take it again.

A CUDA prediction compared with a measured row must predict the code that row ran (its ``code_path`` column:
docs/CONTRACTS.md), not today's default: ``TOPK_BENCH_TRITON`` (the Triton kernels: ``1`` where the row says
``triton:<version>``, ``0`` where it says ``torch:<why>``, whatever :mod:`topk_bench.attention.kernels.triton.defaults`
chooses today) and ``TOPK_BENCH_CUDA_TORCH`` (the torch path on CUDA, :mod:`topk_bench.attention.shared.cuda_torch`).
"""

import contextlib
import os
from collections.abc import Iterator, Mapping

from topk_bench.attention import provenance
from topk_bench.attention.kernels import triton as triton_kernels
from topk_bench.attention.shared import cuda_torch

# Rows written before ``code_path`` was a column (tests/data/h100-ci*.csv, tests/data/h100-2026-11-26/): topk_fast
# and page_topk ran the torch path as it was then, neither the Triton kernels nor the batched CUDA path.
BEFORE_CODE_PATH = {triton_kernels.SWITCH_ENV: "0", cuda_torch.ENV: cuda_torch.BAGS}


def environment(row: Mapping[str, str]) -> dict[str, str]:
    """The variables that select the code ``row`` records: ``code_path``'s pairs, or :data:`BEFORE_CODE_PATH`
    for a row without the column. A row whose ``code_path`` predates the ``cuda_torch`` pair ran the bags path."""
    if "code_path" not in row:
        return dict(BEFORE_CODE_PATH)
    pairs = provenance.parse(row["code_path"] or "")
    triton = pairs.get(provenance.TRITON_KERNELS, "")
    return {
        triton_kernels.SWITCH_ENV: "1" if triton.startswith("triton:") else "0",
        cuda_torch.ENV: pairs.get(provenance.CUDA_TORCH, cuda_torch.BAGS),
    }


@contextlib.contextmanager
def ran_as_measured(row: Mapping[str, str]) -> Iterator[None]:
    """:func:`environment` of ``row`` set while the block runs (the switches are read at every call), restored
    after it."""
    before = {name: os.environ.get(name) for name in environment(row)}
    os.environ.update(environment(row))
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_as_measured(monkeypatch, row: Mapping[str, str]) -> None:
    """Set :func:`environment` of ``row`` for the rest of a test (pytest's ``monkeypatch``)."""
    for name, value in environment(row).items():
        monkeypatch.setenv(name, value)
