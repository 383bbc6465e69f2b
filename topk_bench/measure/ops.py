"""The aten ops one iteration dispatches (``ops_per_iter``), and which SDPA backend ran (``sdpa_backend``).

A host dispatches ops one at a time, each costing microseconds (Python, the dispatcher, a kernel launch): a
method of 3,000 ops per iteration at ~20 µs each takes 60 ms of host time, and is dispatch-bound wherever its
device work takes less. The count says when a time is the host's, not the kernels'.

- Eager code: :class:`OpCounter`, a ``TorchDispatchMode`` active through the profiling iteration. It counts
  every aten op that reaches the kernels: below autograd (backward's ops included), composite ops already
  decomposed into what they run, the ``prim`` queries C++ makes of a tensor (its device) left out. The same
  ops reach it on the CPU, on CUDA and under ``FakeTensorMode``, so a prediction counts what a measurement
  counts.
- A compiled call (flex, ``compile = true``): no dispatch mode can follow it (torch.compile skips a frame
  run under one), so the profiling iteration runs under ``torch.profiler`` instead, and :func:`profiled`
  counts from its trace the aten ops dispatched from outside any other aten op (the eager code around the
  call, and what the compiled code still dispatches: extern kernels such as matmuls) plus one per compiled
  graph called (its fused kernels run without the dispatcher).

SDPA (``scaled_dot_product_attention``) picks a backend per call; the op it dispatches names it (its
``sdpa_backend`` in :mod:`topk_bench.aten_ops`, the catalogue that also says which ops launch a kernel), on
both paths: a fused kernel's own op, or for the math path ``_safe_softmax``, which only SDPA's math composite calls.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torch.utils._python_dispatch import TorchDispatchMode

from topk_bench import aten_ops

if TYPE_CHECKING:
    import torch.profiler

# torch.profiler's name of a call into a compiled graph (inductor's output code).
COMPILED_GRAPH_EVENT = "## Call CompiledFxGraph"


@dataclass
class OpCount:
    """Ops of one iteration, those of them that launch a kernel on CUDA, and the SDPA backends their names show
    (empty: no SDPA call)."""

    ops: int = 0
    sdpa: set[str] = field(default_factory=set)
    launches: int = 0

    def note(self, name: str, launches: int = 1) -> None:
        """One dispatched op, by its name without namespace or overload (``mm``); ``launches``: the kernels it
        launches (a custom op may launch a chain of them)."""
        self.ops += 1
        self.launches += launches
        backend = aten_ops.op(name).sdpa_backend
        if backend:
            self.sdpa.add(backend)

    @property
    def sdpa_backend(self) -> str:
        """The backends SDPA ran, ``;``-separated ("" when it did not run)."""
        return ";".join(sorted(self.sdpa))


class OpCounter(TorchDispatchMode):
    """Counts the aten ops that reach the kernels while active (:class:`OpCount` in ``counted``)."""

    def __init__(self) -> None:
        super().__init__()
        self.counted = OpCount()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if aten_ops.is_iteration_op(func):
            self.counted.note(func._opname, aten_ops.launches_kernel(func))
        return func(*args, **(kwargs or {}))


def profiled(events: Iterable) -> OpCount:
    """The ops of a ``torch.profiler`` trace of one iteration (its ``events()``): aten ops not nested in another
    aten op, and one per compiled graph called."""
    counted = OpCount()
    for event in events:
        name = event.name
        if name.startswith(COMPILED_GRAPH_EVENT):
            counted.ops += 1
            counted.launches += 1  # at least one kernel (inductor's fused kernels are not seen here)
        elif name.startswith("aten::") and not _inside_aten_op(event):
            op = name[len("aten::") :]
            counted.note(op, aten_ops.launches_kernel_by_name(op))
    return counted


def _inside_aten_op(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return True
        parent = parent.cpu_parent
    return False


class ProfiledOps:
    """:func:`profiled` of the region it is active over, in ``counted`` (for a compiled call on CUDA)."""

    def __init__(self) -> None:
        self.counted = OpCount()
        self._profile: torch.profiler.profile | None = None

    def __enter__(self) -> ProfiledOps:
        import torch.profiler

        self._profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        self._profile.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        assert self._profile is not None, "__exit__ without __enter__"
        self._profile.__exit__(*exc)
        self.counted = profiled(self._profile.events())
