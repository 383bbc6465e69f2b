"""A simulation of PyTorch's CUDA caching allocator: allocated and reserved bytes of a sequence of allocations.

Pure Python, no torch: what ``torch.cuda.memory_allocated`` / ``memory_reserved``
(and their peaks) would read after a given sequence of ``malloc`` and ``free``
on one device and one stream, with the allocator's default settings
(``expandable_segments`` off, no ``max_split_size_mb``, no
``roundup_power2_divisions``, no garbage-collection threshold, no memory
limit). Written from the allocator's documented behaviour (the "CUDA semantics
/ memory management" notes and the allocator's stated constants):

- a request is rounded up to a multiple of 512 bytes (at least 512); a request
  of 0 bytes allocates nothing;
- requests up to 1 MiB are served from the *small* pool, whose segments
  (one ``cudaMalloc`` each) are 2 MiB; larger ones from the *large* pool, whose
  segments are 20 MiB for requests under 10 MiB, and the request rounded up to
  a multiple of 2 MiB from 10 MiB on;
- a request takes the smallest free cached block of its pool that fits (the
  lowest address among equal sizes); only when none fits is a segment allocated;
- a block larger than the request is split, the request taking its front, when
  the remainder is at least 512 bytes (small pool) or more than 1 MiB (large
  pool); otherwise the request gets the whole block, and the whole block counts
  in allocated bytes;
- a freed block merges with the free blocks next to it in its segment;
- ``empty_cache`` returns every segment that holds no allocated block;
- allocated bytes = the sizes of the blocks handed out; reserved bytes = the
  sizes of the segments; each has a peak, reset by :meth:`reset_peak` to the
  current value (``torch.cuda.reset_peak_memory_stats``).

Not modelled: other streams (a block freed after use on another stream waits
for an event), ``expandable_segments`` (one growing segment per pool),
out-of-memory handling (freeing cached segments and retrying), CUDA graphs'
private pools, and the address ``cudaMalloc`` returns: here each new segment takes
the addresses just below the previous one's, never reused. Addresses only decide
ties between equal free blocks (the lowest address first); placing new segments
downwards reproduces all 8 of the H100's random sequences
(``tests/predict/test_cuda_allocator.py``), placing them at the lowest free gap 6.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

MIB = 1 << 20
GRANULE = 512  # every block is a multiple of this, at least this
SMALL_REQUEST = 1 * MIB  # requests up to this go to the small pool
SMALL_SEGMENT = 2 * MIB  # the small pool's segment size
LARGE_SEGMENT = 20 * MIB  # the large pool's segment for requests under LARGE_REQUEST
LARGE_REQUEST = 10 * MIB  # from here on a large request gets its own segment, rounded to LARGE_ROUND
LARGE_ROUND = 2 * MIB
TOP = 1 << 50  # the simulated address space's ceiling: segments are placed downwards from it


def rounded(nbytes: int) -> int:
    """The block size of a request of ``nbytes`` (> 0)."""
    return max(GRANULE, -(-nbytes // GRANULE) * GRANULE)


def is_small(size: int) -> bool:
    return size <= SMALL_REQUEST


def segment_size(size: int) -> int:
    """The ``cudaMalloc`` size of a new segment for a block of ``size`` bytes (already rounded)."""
    if is_small(size):
        return SMALL_SEGMENT
    if size < LARGE_REQUEST:
        return LARGE_SEGMENT
    return -(-size // LARGE_ROUND) * LARGE_ROUND


def splits(block_size: int, size: int) -> bool:
    """Whether a free block of ``block_size`` serving ``size`` is split (the rest stays free) or handed out whole."""
    remainder = block_size - size
    return remainder >= GRANULE if is_small(size) else remainder > SMALL_REQUEST


@dataclass(eq=False)
class Block:
    address: int
    size: int
    segment: Segment
    allocated: bool = False
    prev: Block | None = None
    next: Block | None = None


@dataclass(eq=False)
class Segment:
    address: int
    size: int
    small: bool
    first: Block | None = field(default=None, repr=False)

    def blocks(self) -> list[Block]:
        out, block = [], self.first
        while block is not None:
            out.append(block)
            block = block.next
        return out


class CachingAllocator:
    """One device, one stream, default settings. ``malloc`` returns a handle for ``free``.

    ``segment_addresses``: where ``cudaMalloc`` put each new segment, in order (an allocator history records
    them): with them every block lands where the GPU's did, ties included, and the replay is exact (an H100's
    history of 2,602 allocations: every address, and the peaks, to the byte); past their end, or without them,
    segments go downwards (what no prediction can know: the driver's choice of addresses)."""

    def __init__(self, segment_addresses: Iterable[int] = ()) -> None:
        self._given = iter(segment_addresses)
        self.allocated = 0
        self.reserved = 0
        self.peak_allocated = 0
        self.peak_reserved = 0
        self.segments: list[Segment] = []
        self._top = TOP
        # Free blocks of each pool, ordered by (size, address): best fit is the first that is large enough.
        self._free: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}
        self._blocks: dict[int, Block] = {}  # id(block) -> block, for the free lists

    # -- free lists ----------------------------------------------------------

    def _cache(self, block: Block) -> None:
        bisect.insort(self._free[block.segment.small], (block.size, block.address, id(block)))
        self._blocks[id(block)] = block

    def _uncache(self, block: Block) -> None:
        pool = self._free[block.segment.small]
        pool.pop(bisect.bisect_left(pool, (block.size, block.address, id(block))))
        del self._blocks[id(block)]

    def _best_fit(self, size: int) -> Block | None:
        pool = self._free[is_small(size)]
        i = bisect.bisect_left(pool, (size, -1, -1))
        return self._blocks[pool[i][2]] if i < len(pool) else None

    # -- the allocator -------------------------------------------------------

    def _address(self, size: int) -> int:
        """Where a new segment of ``size`` goes: the next given address, else just below the last one (addresses
        only order equal free blocks: the newer segment's comes first, as the H100's sequences show)."""
        given = next(self._given, None)
        if given is not None:
            return given
        self._top -= size
        return self._top

    def _new_segment(self, size: int) -> Block:
        seg = Segment(0, segment_size(size), is_small(size))
        seg.address = self._address(seg.size)
        seg.first = Block(seg.address, seg.size, seg)
        self.segments.append(seg)
        self.reserved += seg.size
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return seg.first

    def malloc(self, nbytes: int) -> Block | None:
        """Allocate ``nbytes``; None for 0 bytes (nothing is allocated, as for an empty tensor)."""
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        if nbytes == 0:
            return None
        size = rounded(nbytes)
        block = self._best_fit(size)
        if block is not None:
            self._uncache(block)
        else:
            block = self._new_segment(size)
        if splits(block.size, size):
            rest = Block(block.address + size, block.size - size, block.segment, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            self._cache(rest)
        block.allocated = True
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block

    def free(self, block: Block | None) -> None:
        if block is None:
            return
        if not block.allocated:
            raise ValueError(f"block at {block.address} freed twice")
        block.allocated = False
        self.allocated -= block.size
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._uncache(neighbour)
                self._merge(block, neighbour)
        self._cache(block)

    @staticmethod
    def _merge(block: Block, neighbour: Block) -> None:
        """Absorb the free ``neighbour`` (just before or just after ``block``) into ``block``."""
        if neighbour is block.prev:
            block.address = neighbour.address
            block.prev = neighbour.prev
            if block.prev is None:
                block.segment.first = block
            else:
                block.prev.next = block
        else:
            block.next = neighbour.next
            if block.next is not None:
                block.next.prev = block
        block.size += neighbour.size

    def empty_cache(self) -> None:
        """Return every segment that holds no allocated block (``torch.cuda.empty_cache``)."""
        kept = []
        for seg in self.segments:
            whole = seg.first
            if whole is not None and whole.next is None and not whole.allocated:
                self._uncache(whole)
                self.reserved -= seg.size
            else:
                kept.append(seg)
        self.segments = kept

    def reset_peak(self) -> None:
        """Both peaks restart from the current values (``torch.cuda.reset_peak_memory_stats``)."""
        self.peak_allocated = self.allocated
        self.peak_reserved = self.reserved


# -- what a simulated measurement reads (topk_bench.predict.simulated replays one) ---------------

FREE = -1  # an event (serial, FREE) frees what event (serial, nbytes) allocated


@dataclass(frozen=True)
class Simulated:
    """What ``measure_cuda`` would read: ``memory_allocated`` after the build; the peaks after the reset; what the
    warm-up left allocated besides (``workspace_bytes``; None without a reset: the paper's protocol)."""

    baseline_bytes: int
    peak_bytes: int
    reserved_bytes: int
    workspace_bytes: int | None = None
