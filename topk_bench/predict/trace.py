"""Every storage a fake run allocates and frees, in order: what the simulated allocator (:mod:`.allocator`)
replays."""

from __future__ import annotations

import torch

from topk_bench.measure.memory import LiveBytes
from topk_bench.predict import allocator

Event = tuple[int, int]  # (serial, nbytes): an allocation of nbytes; (serial, FREE): its free


class AllocationTrace(LiveBytes):
    """:class:`LiveBytes` that also records, in order, every storage allocated and freed.

    Each storage gets a serial number (``StorageImpl`` addresses are reused after a
    free); :meth:`take` hands over the events so far, for
    :mod:`.allocator`. Frees keep being recorded after the
    mode exits (a storage freed later is still freed), so take the events where
    the region of interest ends.
    """

    FREE = allocator.FREE

    def __init__(self) -> None:
        super().__init__()
        self.events: list[Event] = []
        self._serials: dict[int, int] = {}
        self._count = 0

    def _allocated(self, key: int, nbytes: int, op) -> None:
        self._count += 1
        self._serials[key] = self._count
        self.events.append((self._count, nbytes))

    def _released(self, key: int) -> None:
        self.events.append((self._serials.pop(key), self.FREE))

    def begin_iteration(self, *, counted: bool) -> None:
        """Hook: an iteration of the traced run begins (a CUDA prediction traces the build, then two iterations);
        ``counted``: its ops and FLOPs are counted (a tracker adds none to it)."""

    def serial(self, tensor: torch.Tensor) -> int:
        """The serial number of a live tensor's storage."""
        return self._serials[tensor.untyped_storage()._cdata]

    def take(self) -> list[Event]:
        events, self.events = self.events, []
        return events
