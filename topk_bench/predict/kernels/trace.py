""":class:`KernelTrace`: the fake run's allocation trace as CUDA's kernels would allocate it.

An :class:`~topk_bench.predict.trace.AllocationTrace` records the storages the fake (CPU) kernels return.
Here each op with a rule (:mod:`.registry`) has its outputs' allocations held back while it runs, then
replayed in the order and at the sizes its CUDA kernel allocates them, with the kernel's own buffers around
them (:mod:`.program`): so the event sequence the caching-allocator simulation replays is CUDA's. Ops with
no rule keep the fake run's events; those of them that may allocate otherwise on CUDA are collected in
:attr:`unmodelled`. The autograd engine's gradient accumulations, out of place in the fake run, are replayed
in place where CUDA's engine adds in place (:mod:`.accumulation`). A library workspace (:class:`Workspace`) is
allocated at its first use on a thread and never freed: its serials are :attr:`persistent`.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_leaves

from topk_bench.predict.kernels import registry
from topk_bench.predict.kernels.accumulation import EngineAdds
from topk_bench.predict.kernels.gpus import Gpu
from topk_bench.predict.kernels.program import (
    Call,
    Free,
    Keep,
    Out,
    Temp,
    Unmodelled,
    Workspace,
    non_overlapping_and_dense,
)
from topk_bench.predict.trace import AllocationTrace


class KernelTrace(AllocationTrace):
    """:class:`AllocationTrace` with the CUDA kernels' own allocations, for ``gpu``."""

    def __init__(self, gpu: Gpu, adds: EngineAdds | None = None) -> None:
        super().__init__()
        self.gpu = gpu
        self.adds = adds
        self.unmodelled: set[str] = set()
        self._held: dict[int, int] | None = None  # the ruled op's outputs: storage key -> nbytes, in order
        self._kept: dict[int, list[int]] = {}  # storage key -> serials freed with it (Keep)
        self._sum: tuple | None = None  # an engine accumulation to settle: sum's key, operands' keys
        self._freed: dict[int, int] = {}  # storages freed since that accumulation: key -> serial
        self.workspaces: dict[tuple[str, str], int] = {}  # (library, thread) -> the serial of its workspace

    # -- events ------------------------------------------------------------

    def _buffer(self, step: Temp | Keep | Workspace, func) -> int:
        """A new allocation that no storage stands for: ``step`` of the rule of ``func`` (a kernel's own buffer, a
        library's workspace); its serial. A hook too (a profile names it)."""
        self._count += 1
        self.events.append((self._count, step.nbytes))
        return self._count

    def _buffer_freed(self, serial: int) -> None:
        """A kernel's own buffer is freed (a hook too)."""
        self.events.append((serial, self.FREE))

    def _emit(self, key: int, nbytes: int, func) -> None:
        """The held output ``key`` of ``func`` is allocated now, as CUDA's kernel allocates it (``nbytes``)."""
        super()._allocated(key, nbytes, func)

    def _allocated(self, key: int, nbytes: int, op) -> None:
        if self._held is not None and op is not None:
            self._held[key] = nbytes  # replayed when the op finishes, as its rule says
        else:
            super()._allocated(key, nbytes, op)

    def _released(self, key: int) -> None:
        if self._held is not None and key in self._held:  # freed before its op finished: never allocated
            del self._held[key]
            return
        if self._sum is not None and key in self._serials:
            self._freed[key] = self._serials[key]
        super()._released(key)
        for serial in self._kept.pop(key, ()):
            self._buffer_freed(serial)

    # -- ops ---------------------------------------------------------------

    def _op_started(self, func, args, kwargs) -> None:
        self._settle()
        if registry.lookup(func) is not None:
            self._held = {}
        if registry.unmodelled(func):
            self.unmodelled.add(str(func))
        super()._op_started(func, args, kwargs)

    def _op_finished(self, func, args, kwargs, out) -> None:
        if self.adds is not None and self.adds.is_accumulation(func, args, kwargs):
            # Keys only: holding the operands would keep them alive.
            dense = [
                a.untyped_storage()._cdata for a in args if a.layout == torch.strided and non_overlapping_and_dense(a)
            ]
            self._sum, self._freed = (out.untyped_storage()._cdata, dense), {}
        if self._held is not None:
            held, self._held = self._held, None
            ruled = registry.lookup(func)
            assert ruled is not None, "ops are held only when they have a rule (_op_started)"
            steps = ruled.steps(Call(func, args, kwargs, out, self.gpu))
            if any(isinstance(s, Unmodelled) for s in steps):
                self.unmodelled.add(str(func))
            self._replay([s for s in steps if not isinstance(s, Unmodelled)], held, self._output_keys(out), func)
        super()._op_finished(func, args, kwargs, out)

    # -- the engine's accumulations ----------------------------------------

    def _settle(self) -> None:
        """Replay the last accumulation in place if CUDA's engine did: into the operand whose last reference
        the buffer held (the fake run freed it right after the sum), if dense (``can_accumulate_inplace``)."""
        if self._sum is None:
            return
        (total, dense), self._sum = self._sum, None
        for key in dense:  # old first, then new, as InputBuffer::accumulate tries them
            if key in self._freed and total in self._serials:
                self._in_place(total, self._freed[key])
                return

    def _in_place(self, total: int, operand: int) -> None:
        """The sum (storage ``total``) was computed into the operand allocated as ``operand``: neither the sum's
        allocation nor the operand's free happen; the sum's storage continues the operand's allocation."""
        serial = self._serials[total]
        for event in ((serial, None), (operand, self.FREE)):
            index = next(
                i
                for i in range(len(self.events) - 1, -1, -1)
                if self.events[i][0] == event[0] and (event[1] is None) != (self.events[i][1] == self.FREE)
            )
            del self.events[index]
        self._serials[total] = operand

    @property
    def persistent(self) -> frozenset[int]:
        """The serials of the library workspaces allocated so far: never freed (CublasHandlePool.cpp keeps one per
        handle and stream until the process ends; ``empty_cache`` cannot return an allocated block)."""
        return frozenset(self.workspaces.values())

    def _workspace(self, step: Workspace, func) -> None:
        thread = "backward" if torch._C._current_autograd_node() is not None else "forward"
        if (step.library, thread) not in self.workspaces:
            self.workspaces[(step.library, thread)] = self._buffer(step, func)

    def take(self):
        self._settle()
        return super().take()

    @staticmethod
    def _output_keys(out) -> list[int | None]:
        keys = []
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                keys.append(leaf.untyped_storage()._cdata if leaf.layout == torch.strided else None)
        return keys

    def _replay(self, steps, held: dict[int, int], keys: list[int | None], func) -> None:
        """Emit the held outputs of ``func`` and its kernel's buffers in the order of ``steps``."""
        named = {s.index for s in steps if isinstance(s, Out)}
        for index, key in enumerate(keys):  # outputs the program does not place come first
            if index not in named and key in held:
                self._emit(key, held.pop(key), func)
        temps: dict[str, int] = {}
        for step in steps:
            if isinstance(step, Out):
                key = keys[step.index]
                if key in held:  # a new storage (not a view of an input, nor an output counted already)
                    size = held.pop(key)
                    self._emit(key, size if step.nbytes is None else step.nbytes, func)
            elif isinstance(step, Temp):
                temps[step.name] = self._buffer(step, func)
            elif isinstance(step, Free):
                self._buffer_freed(temps.pop(step.name))
            elif isinstance(step, Workspace):
                self._workspace(step, func)
            elif isinstance(step, Keep):
                serial = self._buffer(step, func)
                key = keys[step.index]
                if key is None or key not in self._serials:
                    self._buffer_freed(serial)  # nothing to live with: a temporary
                else:
                    self._kept.setdefault(key, []).append(serial)
        for key, size in held.items():  # storages of the op that are none of its outputs' (not expected)
            self._emit(key, size, func)
        for serial in reversed(list(temps.values())):  # C++ scope exit: last allocated, first freed
            self._buffer_freed(serial)
