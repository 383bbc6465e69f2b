"""A slowdown injected on purpose, for the tests and the demonstration of the time gate
(``topk-bench gate``): ``TOPK_BENCH_TEST_SLOWDOWN="topk_fast=1.3"`` makes every timed iteration of
``topk_fast`` last 1.3 times as long, forward and backward each, by spinning on the CPU inside the timed region.
A real slowdown, not a rewritten number: the row's contention, its per-round medians and its reference in the
same round all see it as they would see a slower kernel.

Never set outside tests: a row measured under it is marked nowhere else. Bad text raises ``ValueError`` (the case
is then an ``error`` row naming the variable), never a silent full-speed run.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable

VARIABLE = "TOPK_BENCH_TEST_SLOWDOWN"


@functools.lru_cache(maxsize=4)
def factors(text: str) -> dict[str, float]:
    """``"topk_fast=1.3,page_topk=1.1"`` -> ``{"topk_fast": 1.3, "page_topk": 1.1}``."""
    out: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        try:
            factor = float(value)
        except ValueError:
            factor = math.nan
        if not sep or not name.strip() or not math.isfinite(factor) or factor < 1:
            raise ValueError(f"{VARIABLE}: expected IMPL=FACTOR[,IMPL=FACTOR...] with FACTOR >= 1, got {item!r}")
        out[name.strip()] = factor
    return out


def factor(impl: str) -> float:
    """How many times longer each timed iteration of ``impl`` is made to last (1.0: not slowed)."""
    return factors(os.environ.get(VARIABLE, "")).get(impl, 1.0)


def stretch(clock: Callable[[], float], start: float, by: float) -> float:
    """Spin until ``by`` times the time since ``start`` has passed; the clock's reading then."""
    now = clock()
    if by > 1.0:
        until = start + (now - start) * by
        while now < until:
            now = clock()
    return now
