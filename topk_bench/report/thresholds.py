"""The thresholds of ``topk-bench compare`` (kept apart so that ``--help`` shows them without importing pandas)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from topk_bench.errors import BadInput


@dataclass(frozen=True)
class Thresholds:
    time_factor: float = 1.10
    memory_factor: float = 1.001
    reserved_factor: float = 1.05
    alpha: float = 0.002

    def validate(self) -> Thresholds:
        for name in ("time_factor", "memory_factor", "reserved_factor"):
            value = getattr(self, name)
            if not (value >= 1 and math.isfinite(value)):
                raise BadInput(f"expected a factor >= 1, got {value}", key=f"--{name.replace('_', '-')}")
        if not 0 < self.alpha < 1:
            raise BadInput(f"expected 0 < alpha < 1, got {self.alpha}", key="--alpha")
        return self


# The defaults, one frozen instance (a default argument built once).
DEFAULT_THRESHOLDS = Thresholds()
