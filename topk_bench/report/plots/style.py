"""How a figure writes its numbers (sizes, powers of two) and draws a failed point.

The colour and marker of each implementation are :mod:`topk_bench.report.plots.palette`'s.
"""

from __future__ import annotations

import math

from topk_bench.status import Status

# How a failed point is drawn and annotated.
FAILURE_MARKER = "X"
FAILURE_TEXT: dict[str, str] = {  # looked up by a CSV cell's status
    Status.OOM: "OOM",
    Status.OVER_BUDGET: "over budget",
    Status.TIMEOUT: "timeout",
    Status.CRASHED: "crashed",
    Status.ERROR: "error",
    Status.NONFINITE: "NaN/inf",
    Status.NOT_AS_ASKED: "not as asked",
}


def format_size(value: float) -> str:
    """Tick label of a size: 512, 1K, 64K, 1M (binary K and M, as sizes are powers of two)."""
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if value >= size and value % size == 0:
            return f"{int(value) // size}{unit}"
    return f"{value:g}"


def format_power_of_two(value: float) -> str:
    """Tick label as the paper writes chunk sizes: 2^9."""
    exponent = math.log2(value)
    return f"$2^{{{exponent:g}}}$" if exponent == int(exponent) else f"{value:g}"
