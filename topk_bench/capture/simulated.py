"""The peak of a predicted CUDA case, block by block: which storages hold the simulated allocator's peak.

``--predict --device cuda`` traces the fake run as CUDA's kernels allocate
(:class:`~topk_bench.predict.kernels.KernelTrace`) and replays it on the simulated caching allocator
(:mod:`topk_bench.predict.simulated`). :class:`KernelAttribution` is that trace attributed: every storage,
and every kernel's own buffer and library workspace (which no storage stands for), with the op and the line
that made it. :class:`PeakSimulation` is the replay, noting which blocks are handed out at the moment of the
peak of the measured region; each is one allocation of the trace (an earlier timed iteration's kept loss, a
workspace the warm-up left, included), and its bytes are the block's size as the allocator counts it (rounded
up to 512 bytes, or a whole block not worth splitting), so that the rows sum to the simulated
``peak_bytes - baseline_bytes``.
"""

from __future__ import annotations

from topk_bench.capture import sources as src
from topk_bench.capture.attribution import Attribution
from topk_bench.capture.rows import Category, Row
from topk_bench.predict.kernels import EngineAdds, Gpu, KernelTrace
from topk_bench.predict.kernels.program import Workspace
from topk_bench.predict.simulated import SimulatedCudaSteps


class KernelAttribution(KernelTrace, Attribution):
    """:class:`KernelTrace` attributed (:class:`Attribution` through the trace's hooks).

    An op with a rule has its outputs held back until its kernel's program places them: what made them (shape,
    dtype) is noted when the fake run counts them, and they are described when the trace allocates them. A
    kernel's own buffer is described by the op whose rule allocated it, at that op's line: category
    ``temporaries``, or ``workspace`` for a library's (cuBLAS). A gradient the engine sums in place on CUDA
    continues the operand's allocation, on the timeline too.
    """

    def __init__(self, sources: src.Sources, gpu: Gpu, adds: EngineAdds | None = None):
        super().__init__(gpu, adds)
        self.sources = sources
        self._held_made: dict[int, tuple[tuple[int, ...], str]] = {}  # held output key -> (shape, dtype)

    def _allocated(self, key: int, nbytes: int, op) -> None:
        if self._held is not None and op is not None:
            self._held_made[key] = Attribution._made(self, key)
        super()._allocated(key, nbytes, op)

    def _made(self, key: int) -> tuple[tuple[int, ...], str]:
        made = self._held_made.pop(key, None)
        return made if made is not None else super()._made(key)

    def _buffer(self, step, func) -> int:
        serial = super()._buffer(step, func)
        kind = Category.WORKSPACE if isinstance(step, Workspace) else Category.TEMPORARIES
        self._describe(serial, step.nbytes, func, (), "", kind=kind)
        return serial

    def _buffer_freed(self, serial: int) -> None:
        super()._buffer_freed(serial)
        self.steps.append((self.ops, -serial))

    def _in_place(self, total: int, operand: int) -> None:
        """Neither the sum's allocation nor the operand's free happened: the timeline loses both steps."""
        made = self._serials[total]
        super()._in_place(total, operand)
        for step in (made, -operand):
            index = next(i for i in range(len(self.steps) - 1, -1, -1) if self.steps[i][1] == step)
            del self.steps[index]
            if index < self.peak_at:
                self.peak_at -= 1
        self.storages[operand].freed_in_run = False


class PeakSimulation(SimulatedCudaSteps):
    """:class:`SimulatedCudaSteps` that keeps the blocks live at the measured region's peak."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.at_peak: dict[tuple, int] = {}  # (tag, serial) -> block size
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
        """One row per block live at the peak that the build did not make (those are the baseline); a block is
        what ``attribution`` (:class:`KernelAttribution`, the trace replayed) says of its allocation."""
        out = []
        for key, size in self.at_peak.items():
            if key in self._setup_keys:
                continue
            storage = attribution.storages[key[1]]
            row = storage.row()
            out.append(
                Row(bytes=size, op=row.op, source=row.source, shape=row.shape, dtype=row.dtype, category=row.category)
            )
        return out
