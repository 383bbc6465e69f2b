"""topk-bench: a benchmarking and profiling harness for memory-efficient attention.

>>> import topk_bench
>>> frame = topk_bench.run_suite("suites/smoke.toml", out="results")
>>> frame = topk_bench.load_results("results/")
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

__version__ = "0.1.0"


def run_suite(path: str | Path, **overrides: Any):
    """Run (or resume) a suite and return its CSV as a pandas DataFrame.

    ``overrides``: ``out``, ``device``, ``predict``, ``repeats``, ``warmup``, ``warmup_s``, ``min_sample_s``, ``timer``,
    ``flush_l2``, ``rounds``, ``threads``, ``remeasure``, ``gpu``, ``max_memory_gib``, ``max_case_seconds``,
    ``executor``, ``jobs``, ``config``, ``resume`` (default True), ``progress``
    (default False), ``yes`` (a suite of more cases than ``max_cases``, more rounds than 1000), ``append``
    (rows added to a file holding another suite's of that name). Invalid input, and a results
    file that cannot be written, raise ``topk_bench.errors.BadInput``.
    """
    from topk_bench.results.columns import CASE_ID
    from topk_bench.run import runner  # lazy: `import topk_bench` must not import torch
    from topk_bench.run.resolve import Flags

    # The keywords mapped once: how the run goes, and the settings it gives over the suite's.
    how = {name: overrides.pop(name) for name in ("config", "resume", "yes", "append") if name in overrides}
    progress = overrides.pop("progress", False)
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(Flags)})
    if unknown:
        raise TypeError(f"run_suite() got an unexpected keyword argument {unknown[0]!r}")
    result = runner.run(path, Flags(**overrides), progress=progress, **how)
    frame = load_results(result.csv_path)
    ids = {c.case_id for c in result.plan.cases}
    return frame[frame[CASE_ID].isin(ids)].reset_index(drop=True)


def load_results(path: str | Path):
    """A results CSV, or every results CSV of a directory, as one pandas DataFrame."""
    from topk_bench.results.frame import load_results as _load

    return _load(path)


__all__ = ["run_suite", "load_results", "__version__"]
