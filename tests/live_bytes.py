"""A small live-tensor-bytes tracker for tests (works with real and fake tensors).

Counts each new storage once when an op creates it and forgets it when the
storage is freed (weak reference), like ``max_memory_allocated`` above a baseline.
"""

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveBytes(TorchDispatchMode):
    def __init__(self, *existing: torch.Tensor):
        super().__init__()
        self._storages = {}
        self.live = 0
        self.peak = 0
        self.largest = 0  # bytes of the largest storage created
        for t in existing:  # views of these are not new allocations
            self._add(t.untyped_storage(), count=False)

    def _add(self, storage, count=True):
        key = storage._cdata
        if key in self._storages:
            return
        size = storage.nbytes() if count else 0
        self._storages[key] = (StorageWeakRef(storage), size)
        self.live += size
        self.largest = max(self.largest, size)

    def poll(self) -> int:
        for key, (ref, size) in list(self._storages.items()):
            if ref.expired():
                del self._storages[key]
                self.live -= size
        return self.live

    def reset_peak(self) -> None:
        self.peak = self.poll()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.poll()
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            # A sparse tensor has no storage of its own: its indices and values are counted.
            if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                self._add(t.untyped_storage())
        self.peak = max(self.peak, self.live)
        return out
