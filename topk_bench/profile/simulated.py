"""The peak of a predicted CUDA case, block by block: which storages hold the simulated allocator's peak.

``--predict --device cuda`` replays the fake run's storages on the simulated caching allocator
(:mod:`topk_bench.measure.simulated`). :class:`PeakSimulation` is that replay, noting which blocks are
handed out at the moment of the peak of the measured region; each is one storage of the profiled
iteration (an earlier timed iteration's kept loss included), and its bytes are the block's size as
the allocator counts it (rounded up to 512 bytes, or a whole block not worth splitting), so that the
rows sum to the simulated ``peak_bytes - baseline_bytes``.
"""

from __future__ import annotations

from topk_bench.measure.simulated import SimulatedCudaSteps
from topk_bench.profile.attribution import Attribution
from topk_bench.profile.rows import Row


class PeakSimulation(SimulatedCudaSteps):
    """:class:`SimulatedCudaSteps` that keeps the blocks live at the measured region's peak."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.at_peak: dict[tuple, int] = {}   # (tag, serial) -> block size
        self._measuring = False
        self._highest = -1

    def _observe(self) -> None:
        if self._measuring and self.alloc.allocated > self._highest:
            self._highest = self.alloc.allocated
            self.at_peak = {key: block.size for key, block in self._handles.items() if block is not None}

    def _replay(self, events, tag) -> None:
        for event in events:
            super()._replay([event], tag)
            self._observe()

    def start(self, wl, *, reset_peak: bool) -> None:
        super().start(wl, reset_peak=reset_peak)
        self._measuring, self._highest = True, -1
        self._observe()

    def rows(self, attribution: Attribution) -> list[Row]:
        """One row per block live at the peak that the build did not make (those are the baseline)."""
        out = []
        for key, size in self.at_peak.items():
            if key in self._setup_keys:
                continue
            storage = attribution.storages[key[1]]
            row = storage.row()
            out.append(Row(bytes=size, op=row.op, source=row.source, shape=row.shape, dtype=row.dtype,
                           category=row.category))
        return out
