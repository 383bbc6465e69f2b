"""Live tensor bytes: the CPU (and FakeTensor) analogue of ``torch.cuda.max_memory_allocated``.

A ``TorchDispatchMode`` sees every aten op below autograd, forward and
backward alike. Each storage an op returns is counted once, keyed by the
identity of its ``StorageImpl``; a ``weakref.finalize`` on the storage's Python
object subtracts it when the storage is freed (PyTorch preserves that Python
object for as long as the C++ storage lives, so the finalizer fires exactly at
the free). Views and in-place results share a storage already counted, so
they add nothing. Under ``FakeTensorMode`` the same code sizes any
configuration without allocating anything.

Not seen: scratch buffers a kernel allocates and frees internally (below the
dispatcher), and memory held by libraries (BLAS packing buffers, thread stacks).
A compiled call (FlexAttention) is measured by :class:`AllocatorBytes` instead, from
the allocator's own reports to the profiler.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from topk_bench.measure.ops import OpCount, profiled

_DEVICE = torch.ops.prim.device.default


class OverBudget(RuntimeError):
    """Live bytes went past the tracker's limit (raised from inside the op that crossed it)."""

    def __init__(self, live_bytes: int, limit: int):
        self.live_bytes = live_bytes
        self.limit = limit
        super().__init__(f"live tensor bytes {live_bytes} exceed the memory budget of {limit} bytes")


class LiveBytes(TorchDispatchMode):
    """Counts live tensor storages while active.

    ``register(...)`` first the tensors that exist before the measured region
    (inputs, parameters, buffers): they form ``baseline_bytes``. ``peak_bytes``
    is the high-water mark of all live bytes, baseline included.
    """

    def __repr__(self) -> str:  # torch names the mode in errors (an op it cannot follow): no address there
        return "LiveBytes (topk-bench's CPU memory tracker)"

    def __init__(self, *, round_to: int = 1, limit: int | None = None):
        super().__init__()
        if round_to < 1:
            raise ValueError(f"round_to must be >= 1, got {round_to}")
        self.round_to = round_to
        self.limit = limit
        self.current_bytes = 0
        self.peak_bytes = 0
        self.baseline_bytes = 0
        self._live: dict[int, int] = {}  # StorageImpl address -> counted bytes
        self._op = None  # the op whose outputs are being counted (None: registered tensors)
        # Open high-water marks (topk_bench.measure.stages: one per stage entered), each the highest live bytes
        # since it was opened; kept apart from peak_bytes, which a subclass's attribution of the peak follows.
        self.watermarks: list[int] = []

    # -- bookkeeping -------------------------------------------------------

    def _rounded(self, nbytes: int) -> int:
        return -(-nbytes // self.round_to) * self.round_to

    def _storages(self, tensor: torch.Tensor) -> list[torch.UntypedStorage]:
        if tensor.layout == torch.sparse_coo:
            # A sparse tensor has no storage of its own: its indices and values do.
            return [s for part in (tensor._indices(), tensor._values()) for s in self._storages(part)]
        if tensor.layout in (torch.sparse_csr, torch.sparse_bsr):
            parts = (tensor.crow_indices(), tensor.col_indices(), tensor.values())
            return [s for part in parts for s in self._storages(part)]
        if tensor.layout in (torch.sparse_csc, torch.sparse_bsc):
            parts = (tensor.ccol_indices(), tensor.row_indices(), tensor.values())
            return [s for part in parts for s in self._storages(part)]
        return [tensor.untyped_storage()]

    def _track(self, tensor: torch.Tensor) -> None:
        for storage in self._storages(tensor):
            key = storage._cdata
            nbytes = self._rounded(storage.nbytes())
            known = self._live.get(key)
            if known is None:
                weakref.finalize(storage, self._free, key)
            elif known == nbytes:
                continue  # a view or an in-place result: already counted
            else:
                self._released(key)  # resized in place (``out=`` ops): a new allocation replaces the old
            self._live[key] = nbytes
            self.current_bytes += nbytes - (known or 0)
            self._allocated(key, storage.nbytes(), self._op)
        if self.current_bytes > self.peak_bytes:
            self.peak_bytes = self.current_bytes
        marks = self.watermarks
        for i, mark in enumerate(marks):
            if self.current_bytes > mark:
                marks[i] = self.current_bytes
        if self.limit is not None and self.current_bytes > self.limit:
            raise OverBudget(self.current_bytes, self.limit)

    def _free(self, key: int) -> None:
        if key in self._live:
            self._released(key)
        self.current_bytes -= self._live.pop(key, 0)

    def _allocated(self, key: int, nbytes: int, op) -> None:
        """Hook: a storage of ``nbytes`` (unrounded) was counted under ``key``; ``op``: the aten overload whose
        output it is (None: registered, not made by an op)."""

    def _released(self, key: int) -> None:
        """Hook: the storage counted under ``key`` is gone."""

    def _op_started(self, func, args, kwargs) -> None:
        """Hook: the aten overload ``func`` is about to run (what it allocates next is its output)."""

    def _op_finished(self, func, args, kwargs, out) -> None:
        """Hook: ``func`` ran and its outputs are counted (its inputs, if the last references, are still alive)."""

    # -- public ------------------------------------------------------------

    def register(self, *objects: torch.Tensor | torch.nn.Module | Iterable[torch.Tensor]) -> None:
        """Count tensors (or a module's parameters and buffers) that already exist, as baseline."""
        for obj in objects:
            if isinstance(obj, torch.nn.Module):
                tensors = [*obj.parameters(), *obj.buffers()]
            elif isinstance(obj, torch.Tensor):
                tensors = [obj]
            else:
                tensors = [t for t in obj if isinstance(t, torch.Tensor)]
            for tensor in tensors:
                self._track(tensor)
        self.baseline_bytes = self.current_bytes

    def reset_peak(self) -> None:
        """Like ``torch.cuda.reset_peak_memory_stats``: the peak restarts from what is live now."""
        self.peak_bytes = self.current_bytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _DEVICE and isinstance(args[0], FakeTensor):
            # C++ asks a fake tensor its device through the Python modes: half the ops of a
            # prediction (a dozen per matmul). Its own answer is FakeTensorMode's, and it
            # allocates and computes nothing: no need to pass it down the modes below.
            return args[0].device
        kwargs = kwargs or {}
        self._op_started(func, args, kwargs)
        out = func(*args, **kwargs)
        self._op = func
        try:
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    self._track(leaf)
        finally:
            self._op = None
        self._op_finished(func, args, kwargs, out)
        return out


class AllocatorBytes:
    """Peak CPU bytes as the allocator reports them to ``torch.profiler``: for a compiled call.

    A ``TorchDispatchMode`` cannot follow a compiled call (FlexAttention's: under a mode,
    torch.compile skips the frame, and the higher-order operator it leaves has no eager rule
    on this path). The profiler's memory events come from the CPU allocator itself, below
    any mode: every allocation and free of the region, in order, kernels' scratch included
    (which :class:`LiveBytes` does not see). ``register`` and ``baseline_bytes`` as there.
    """

    def __init__(self) -> None:
        self.baseline_bytes = 0
        self.peak_bytes = 0
        self.counted = OpCount()  # the profiled region's ops, once it ends
        self._profile: torch.profiler.profile | None = None

    def register(self, *objects) -> None:
        counted = LiveBytes()
        counted.register(*objects)
        self.baseline_bytes = self.peak_bytes = counted.baseline_bytes

    def __enter__(self) -> AllocatorBytes:
        self._profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
        self._profile.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        assert self._profile is not None, "__exit__ without __enter__"
        self._profile.__exit__(*exc)
        self.counted = profiled(self._profile.events())
        live = highest = 0
        for event in allocation_events(self._profile):  # + an allocation, - a free
            live += event.extra_fields.alloc_size
            highest = max(highest, live)
        self.peak_bytes = self.baseline_bytes + highest


def allocation_events(profile: torch.profiler.profile) -> list:
    """The allocator's events of a profile taken with ``profile_memory=True``, in order, each allocation and free
    once. (Not the ops' ``cpu_memory_usage``: an op's includes its children's, so ``matmul`` and the ``mm`` inside
    it would each count the product.)"""
    results = profile.profiler.kineto_results if profile.profiler is not None else None
    if results is None:
        raise ValueError("allocation_events: the profile has not run")
    found, pending = [], list(results.experimental_event_tree())
    while pending:
        node = pending.pop()
        pending.extend(node.children)
        if isinstance(node.extra_fields, torch._C._profiler._ExtraFields_Allocation) and node.extra_fields.alloc_size:
            found.append(node)
    return sorted(found, key=lambda n: (n.start_time_ns, n.id))
