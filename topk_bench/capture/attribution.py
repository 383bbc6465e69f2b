"""The live-bytes tracker that also says, of every storage, what made it, where, and what it is for.

:class:`Attribution` is :class:`~topk_bench.predict.trace.AllocationTrace` (so the same run can be
replayed on the simulated CUDA allocator) that records, per counted storage, its op, shape, dtype and
source, and the order of allocations and frees over the iteration's ops (the timeline). Its peak is
:class:`~topk_bench.measure.memory.LiveBytes`' own, so the rows of the peak sum to
``peak_bytes - baseline_bytes`` by construction.

The source of a storage is the innermost user frame on the stack (:mod:`.sources`). In the backward of a
built-in autograd node no user code is on the stack (the engine runs the node): there the source is the
line of the forward op that created the node, found by autograd's sequence number (each node takes the
next one when created; an op dispatched right after, below autograd, reads it back), as ``torch.fx``
links backward nodes to forward ones. A custom ``autograd.Function``'s backward is user code itself.

Categories (:class:`~.rows.Category`), decided once the iteration is over:

- made in the forward: *saved for backward* when autograd saved it (a saved-tensor hook marks it), else
  a *temporary* (freed soon, or held by the harness: the layer's output until the backward ends);
- made in the backward: a *temporary* when freed while the node that made it still ran, else one of the
  *gradients* (handed on to the next node, or accumulated as a ``.grad``).
"""

from __future__ import annotations

import contextlib
import enum
from dataclasses import dataclass
from typing import Final

import torch
from torch.autograd.graph import Node
from torch.utils._python_dispatch import _disable_current_modes

from topk_bench.capture import sources as src
from topk_bench.capture.rows import Category, Row, shape_text
from topk_bench.predict.trace import AllocationTrace

_current_node = torch._C._current_autograd_node
_graph_task = torch._C._current_graph_task_id
_sequence_nr = torch._C._autograd._get_sequence_nr
_DETACH = torch.ops.aten.detach.default


class _Unset(enum.Enum):
    UNSET = "unset"


_UNSET: Final = _Unset.UNSET  # the op's source, not looked up yet


class Phase(enum.IntEnum):
    BASELINE = 0  # registered before the iteration
    FORWARD = 1
    BACKWARD = 2


@dataclass(slots=True)
class Storage:
    """One counted storage."""

    serial: int
    nbytes: int  # as counted by the tracker
    op: str
    where: src.Where | None
    shape: tuple[int, ...]
    dtype: str
    phase: Phase
    run: tuple[int, int]  # backward: (graph task, which of its node runs) made it; forward: (0, 0)
    saved: bool = False
    freed_in_run: bool = False
    kind: Category | None = None  # a kernel's own buffer or a library workspace: what it is, whatever its phase

    def category(self) -> Category:
        if self.kind is not None:
            return self.kind
        if self.phase is Phase.BACKWARD:
            return Category.TEMPORARIES if self.freed_in_run else Category.GRADIENTS
        if self.phase is Phase.BASELINE:
            return Category.INPUTS
        return Category.SAVED if self.saved else Category.TEMPORARIES

    def row(self) -> Row:
        # A kernel's own buffer has bytes, no shape or dtype (its rule sizes it in bytes).
        shape = shape_text(self.shape) if self.kind is None else ""
        return Row(
            bytes=self.nbytes,
            op=self.op,
            source=src.label(self.where),
            shape=shape,
            dtype=self.dtype,
            category=self.category(),
        )


Step = tuple[int, int]  # (op index, +serial: allocated / -serial: freed)


class Attribution(AllocationTrace):
    """Live bytes with every storage's op, source, shape, dtype and category, and the timeline of the ops."""

    def __init__(self, sources: src.Sources | None = None, *, limit: int | None = None):
        super().__init__()
        self.limit = limit
        self.sources = sources or src.Sources()
        self.storages: dict[int, Storage] = {}
        self.steps: list[Step] = []
        self.ops = 0  # ops dispatched so far (the timeline's x)
        self.backward_from: int | None = None  # the first op of the backward
        self.peak_at = 0  # how many steps of the timeline the peak includes
        self._node_where: dict[int, src.Where | None] = {}  # autograd sequence number -> forward source
        self._node: Node | None = None
        self._task = 0
        self._runs: dict[int, tuple[tuple[int, str], int]] = {}  # graph task -> (its current node, its run number)
        self._op_where: src.Where | None | _Unset = _UNSET
        self._tensor: torch.Tensor | None = None
        self._unpacked: torch.Tensor | None = None  # a saved tensor just unpacked for the backward
        self._marks_saved = True  # the saved-tensor hooks are on in this iteration

    # -- hooks of LiveBytes --------------------------------------------------

    def _op_started(self, func, args, kwargs) -> None:
        super()._op_started(func, args, kwargs)
        self.ops += 1
        self._op_where = _UNSET
        node = _current_node()
        self._node = node
        if node is None:
            seq = _sequence_nr() - 1  # the node this op's autograd kernel just created, if it made one
            if seq not in self._node_where:
                self._node_where[seq] = self._op_where = self.sources.here()
            return
        if self.backward_from is None:
            self.backward_from = self.ops
        # Runs are counted per graph task: a custom Function's backward that calls autograd.grad runs a nested
        # task, and its own node is still running when that returns.
        self._task = _graph_task()
        key = (node._sequence_nr(), node.name())
        current = self._runs.get(self._task)
        if current is None or current[0] != key:
            self._runs[self._task] = (key, (current[1] + 1) if current else 1)

    def _track(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor
        before = self.peak_bytes
        try:
            super()._track(tensor)
        finally:
            self._tensor = None
            if self.peak_bytes > before:
                self.peak_at = len(self.steps)

    def _allocated(self, key: int, nbytes: int, op) -> None:
        super()._allocated(key, nbytes, op)
        shape, dtype = self._made(key)
        self._describe(self._count, self._live[key], op, shape, dtype)

    def _made(self, key: int) -> tuple[tuple[int, ...], str]:
        """The shape and dtype of the storage ``key`` being counted, as its tensor says."""
        tensor = self._tensor
        return (tuple(tensor.shape) if tensor is not None else ()), _dtype(tensor)

    def _describe(
        self, serial: int, nbytes: int, op, shape: tuple[int, ...], dtype: str, kind: Category | None = None
    ) -> None:
        """Record what made the storage allocated as ``serial`` (its op, source, phase), and its step."""
        if op is None:
            phase, where = Phase.BASELINE, None
        else:
            phase = Phase.FORWARD if self._node is None else Phase.BACKWARD
            where = self._where()
        self.storages[serial] = Storage(
            serial=serial,
            nbytes=nbytes,
            op=str(op) if op is not None else "",
            where=where,
            shape=shape,
            dtype=dtype,
            phase=phase,
            run=self._run() if phase is Phase.BACKWARD else (0, 0),
            kind=kind,
        )
        self.steps.append((self.ops, serial))

    def _released(self, key: int) -> None:
        serial = self._serials.get(key)
        super()._released(key)
        if serial is None or serial not in self.storages:
            return
        storage = self.storages[serial]
        task, run = storage.run
        if storage.phase is Phase.BACKWARD and self._runs.get(task, (None, None))[1] == run:
            storage.freed_in_run = True
        self.steps.append((self.ops, -serial))

    def _run(self) -> tuple[int, int]:
        return self._task, self._runs[self._task][1]

    def _where(self) -> src.Where | None:
        """User code on the stack; else, in a backward node, its forward op's line; else the harness's line."""
        if self._op_where is _UNSET:
            self._op_where = self.sources.here()
        where = self._op_where
        if where is not None and self.sources.is_user(where[0]):
            return where
        if self._node is not None:
            forward = self._node_where.get(self._node._sequence_nr())
            if forward is not None:
                return forward
        return where

    # -- saved tensors -------------------------------------------------------

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        """Marks a saved tensor's storage. Returns an alias without its autograd history: the tensor itself
        would hold its own node when it is the op's output (a reference cycle, freed late: a higher peak)."""
        with contextlib.suppress(RuntimeError, NotImplementedError):  # a sparse tensor has no storage of its own
            serial = self._serials.get(tensor.untyped_storage()._cdata)
            if serial in self.storages:
                self.storages[serial].saved = True
        # Below every mode: the alias is no op of the iteration (an op counter would count it; the CUDA trace
        # would settle its pending accumulation at it).
        with _disable_current_modes():
            return tensor.detach()

    def _unpack(self, tensor: torch.Tensor) -> torch.Tensor:
        self._unpacked = tensor  # autograd detaches it next (a variable of its own): no op of the iteration
        return tensor

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _DETACH and self._unpacked is not None and args and args[0] is self._unpacked:
            self._unpacked = None
            with _disable_current_modes():  # below every mode: not counted, not traced
                return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)

    def __enter__(self):
        # While the tracker is on, autograd's saved tensors pass the hook that marks them (and nothing else); not
        # in an iteration whose ops are counted when another is attributed (the engine detaches what a hook
        # unpacks: ops the plain iteration does not dispatch).
        self._hooks = (
            torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
            if self._marks_saved
            else contextlib.nullcontext()
        )
        self._hooks.__enter__()
        try:
            return super().__enter__()
        except BaseException:
            self._hooks.__exit__(None, None, None)
            raise

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._hooks.__exit__(*exc)

    # -- results -------------------------------------------------------------

    def _live_after(self, count: int) -> list[int]:
        """The serials live after the first ``count`` steps of the timeline, in the order they were made."""
        live: dict[int, None] = {}
        for _, step in self.steps[:count]:
            if step > 0:
                live[step] = None
            else:
                live.pop(-step, None)
        return list(live)

    def begin_iteration(self, *, counted: bool) -> None:
        """The timeline starts again from here, what is live now its first steps (of a CUDA prediction's two
        traced iterations, the last, not counted, is the one attributed); the peak restarts from what is live.
        Saved tensors are marked in an iteration not ``counted`` only."""
        self._marks_saved = not counted
        self.steps = [(0, serial) for serial in self._live_after(len(self.steps))]
        self.ops, self.backward_from, self._runs = 0, None, {}
        self.reset_peak()
        self.peak_at = len(self.steps)

    def live_at_peak(self) -> list[Storage]:
        """The storages made during the iteration and live at the moment of the peak."""
        live = self._live_after(self.peak_at)
        return [self.storages[s] for s in live if self.storages[s].phase is not Phase.BASELINE]

    def rows(self) -> list[Row]:
        """One row per storage live at the peak, besides the baseline: they sum to ``peak_bytes - baseline_bytes``."""
        return [s.row() for s in self.live_at_peak()]


def _dtype(tensor: torch.Tensor | None) -> str:
    return str(tensor.dtype).removeprefix("torch.") if tensor is not None else ""
