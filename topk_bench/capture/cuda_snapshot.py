"""The peak of a case measured on CUDA, from the allocator's own history (``torch.cuda.memory``'s snapshot).

:class:`SnapshotCudaSteps` records the caching allocator's history (``_record_memory_history``) from
the first build to the end of the timed iterations, and marks where each build and the measured region
start and end (the length of the history then). The history names each allocation's requested size,
address and Python frames; :func:`peak_blocks` replays it on the simulated allocator
(:mod:`topk_bench.predict.allocator`, from the same empty state, ``empty_cache`` where the
measurement emptied it, each segment at the history's address) to know each block's size as
``memory_allocated`` counts it, and finds the blocks live at the peak of the measured region. The live blocks the latest
build made are the baseline.

Each other block is matched to the storage of the attributed iteration it is (the timed iterations
allocate in the same order as the attributed one, the first warm-up): its op, source, shape, dtype and
category. What no storage of the iteration is (the cuBLAS workspaces the warm-up left, a build inside
the region under the paper's protocol) gets its source from the history's frames. The snapshot itself
is saved as ``snapshot.pickle`` (pytorch.org/memory_viz reads it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils.flop_counter import FlopCounterMode

from topk_bench.capture import sources as src
from topk_bench.capture import timing
from topk_bench.capture.attribution import Attribution, Phase
from topk_bench.capture.rows import Category, Row
from topk_bench.case import Case
from topk_bench.measure import backends, iterations
from topk_bench.measure.ops import OpCounter
from topk_bench.measure.steps import iteration
from topk_bench.predict import allocator
from topk_bench.predict.allocator import CachingAllocator

MAX_ENTRIES = 2_000_000  # history entries kept (a ring buffer): far more than a case's iterations make


@dataclass(frozen=True)
class Block:
    index: int  # position of its allocation in the history
    requested: int
    size: int  # as memory_allocated counts it
    frames: tuple[src.Where, ...]


@dataclass
class Peak:
    bytes: int  # memory_allocated at the peak of the region
    live: list[Block] = field(default_factory=list)  # the blocks live then


def _frames(entry: dict) -> tuple[src.Where, ...]:
    return tuple((f.get("filename", ""), int(f.get("line", 0))) for f in entry.get("frames") or ())


def peak_blocks(trace: list[dict], region: tuple[int, int], *, empty_cache: bool) -> Peak:
    """Replay ``trace`` (one device's history, from an empty allocator) and return the peak of ``region``
    (history positions ``[from, to)``), with ``empty_cache`` first when the measurement called it there. Each
    segment at the address the history gives it, so that equal free blocks are chosen as the GPU chose them."""
    alloc = CachingAllocator(int(e["addr"]) for e in trace if e.get("action") == "segment_alloc")
    live: dict[int | None, tuple[Block, allocator.Block | None]] = {}  # the history's address -> its block
    peak: Peak | None = None
    for i, entry in enumerate(trace[: region[1]]):
        if i == region[0]:
            if empty_cache:
                alloc.empty_cache()
            peak = Peak(alloc.allocated, [b for b, _ in live.values()])
        action, addr = entry.get("action"), entry.get("addr")
        if action == "alloc":
            handle = alloc.malloc(int(entry["size"]))
            live[addr] = (Block(i, int(entry["size"]), handle.size if handle else 0, _frames(entry)), handle)
            if peak is not None and alloc.allocated > peak.bytes:
                peak = Peak(alloc.allocated, [b for b, _ in live.values()])
        elif action in ("free_requested", "free_completed") and addr in live:
            alloc.free(live.pop(addr)[1])
    return peak if peak is not None else Peak(alloc.allocated, [b for b, _ in live.values()])


def _latest_build(builds: list[tuple[int, int]], at: int) -> tuple[int, int]:
    before = [b for b in builds if b[0] <= at]
    return before[-1] if before else (0, 0)


def _storages_in_order(attribution: Attribution) -> list:
    return [s for _, s in sorted(attribution.storages.items()) if s.phase is not Phase.BASELINE and s.nbytes > 0]


def peak_rows(
    trace: list[dict],
    *,
    builds: list[tuple[int, int]],
    region: tuple[int, int],
    empty_cache: bool,
    attribution: Attribution | None,
    sources: src.Sources,
) -> tuple[list[Row], Peak, int, list[str]]:
    """(rows, the peak, baseline bytes, notes): one row per block live at the region's peak but the latest
    build's (the baseline), matched to the attributed iteration's storages where the allocations line up."""
    peak = peak_blocks(trace, region, empty_cache=empty_cache)
    last = max((b.index for b in peak.live), default=region[0])
    build = _latest_build(builds, last)
    in_build = [any(lo <= b.index < hi for lo, hi in builds) for b in peak.live]
    baseline = sum(b.size for b, built in zip(peak.live, in_build) if built and build[0] <= b.index < build[1])
    region_allocs = [
        i
        for i, e in enumerate(trace[region[0] : region[1]], region[0])
        if e.get("action") == "alloc" and not any(lo <= i < hi for lo, hi in builds)
    ]
    storages = _storages_in_order(attribution) if attribution is not None else []
    position = {i: k for k, i in enumerate(region_allocs)}
    lined_up = (
        bool(storages)
        and len(region_allocs) % len(storages) == 0
        and all(int(trace[i]["size"]) == storages[k % len(storages)].nbytes for k, i in enumerate(region_allocs))
    )
    notes = (
        []
        if lined_up or not storages
        else [
            "the timed iterations' allocations do not line up with the attributed iteration's: sources from the "
            "allocator's frames, categories unknown (temporaries)"
        ]
    )
    rows = []
    for block, built in zip(peak.live, in_build):
        if built and build[0] <= block.index < build[1]:
            continue
        if lined_up and block.index in position:
            storage = storages[position[block.index] % len(storages)]
            row = storage.row()
            rows.append(Row(block.size, row.op, row.source, row.shape, row.dtype, row.category))
            continue
        category = Category.INPUTS if built else Category.WORKSPACE if block.index < region[0] else Category.TEMPORARIES
        rows.append(Row(block.size, "", src.label(sources.innermost(block.frames)), "", "", category))
    return rows, peak, baseline, notes


class SnapshotCudaSteps(backends.CudaSteps):
    """A CUDA measurement with the allocator's history recorded, its first warm-up attributed, and one more
    iteration profiled after the timed ones (:mod:`.timing`)."""

    def __init__(self, case: Case, device: torch.device, sources: src.Sources, cuda=torch.cuda):
        super().__init__(case, device, cuda)
        self.sources = sources
        self.attribution: Attribution | None = None
        self.builds: list[tuple[int, int]] = []
        self.region_from = 0
        self.region: tuple[int, int] | None = None
        self.snapshot: dict | None = None
        self.timing: timing.Timing | None = None
        self._recording = False

    def _mark(self) -> int:
        return len(torch.cuda.memory._snapshot()["device_traces"][self.device.index])

    def build(self):
        if self.region is None and not self._recording:
            torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")
            self._recording = True
        begin = self._mark() if self._recording else None
        wl = super().build()
        if begin is not None:
            self.builds.append((begin, self._mark()))
        return wl

    def profile(self, wl) -> None:
        if iterations.compiles(self.case):  # no dispatch mode follows a compiled call: the history's frames only
            super().profile(wl)
            return
        self.attribution = Attribution(self.sources)
        self.attribution.register(wl.model, wl.inputs, wl.kept)
        with FlopCounterMode(display=False) as flops, OpCounter() as ops, self.attribution:
            iteration(wl, self.case)
        self.flops, self.counted = flops.get_total_flops(), ops.counted

    def start(self, wl, *, reset_peak: bool) -> None:
        super().start(wl, reset_peak=reset_peak)
        self.region_from = self._mark()

    def finish(self, wl) -> None:
        region_to = self._mark()
        super().finish(wl)
        self.snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        self._recording, self.region = False, (self.region_from, region_to)
        self.timing = timing.profile_iteration(lambda: iteration(wl, self.case), cuda=True)

    def trace(self) -> list[dict]:
        return self.snapshot["device_traces"][self.device.index] if self.snapshot else []
