"""The peak of a compiled call (FlexAttention on the CPU), allocation by allocation, from the profiler.

No dispatch mode sees a compiled call's storages (:class:`~topk_bench.measure.memory.AllocatorBytes`),
but the profiler's own allocation events do, each inside the op that allocated and the Python calls
above it (``with_stack``). :class:`AllocatorRows` is ``AllocatorBytes`` that keeps them: the
allocations live at the moment its peak was reached are the rows, each as big as the allocator says.
The source: the innermost Python call on the way down that the user's code made (in the compiled
call, the line of the implementation that called it); where an op is called straight from a user
function the profiler records no line, only the function's, and that is what the source names.
Categories: temporaries (nothing here tells what autograd saves: the compiled call runs without it on
the CPU, whose FlexAttention has no backward).
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch.profiler import ProfilerActivity

from topk_bench.capture import sources as src
from topk_bench.capture.rows import Category, Row
from topk_bench.measure.memory import AllocatorBytes, allocation_events


def _where(node, sources: src.Sources) -> src.Where | None:
    """The innermost user line on the way down to ``node`` (see the module's doc)."""
    harness = None
    while node is not None:
        fields = node.extra_fields
        frames = [getattr(fields, "callsite", None), getattr(fields, "caller", None)]
        for frame in filter(None, frames):
            where = (frame.file_name, frame.line_number)
            found = sources.innermost([where])
            if found is not None and sources.is_user(found[0]):
                return found
            harness = harness or found
        node = node.parent
    return harness


def _op(node) -> str:
    """The innermost op (or recorded function: ``## Call CompiledFxGraph <hash> ##`` becomes ``CompiledFxGraph``)."""
    while node is not None:
        if type(node.extra_fields).__name__ == "_ExtraFields_TorchOp":
            return re.sub(r"^## Call (\w+) \w+ ##$", r"\1", node.name).replace("::", ".")
        node = node.parent
    return ""


class AllocatorRows(AllocatorBytes):
    """:class:`AllocatorBytes` whose allocations live at the peak become rows."""

    def __init__(self, sources: src.Sources):
        super().__init__()
        self.sources = sources
        self.rows: list[Row] = []
        self.notes: list[str] = []

    def __enter__(self) -> AllocatorRows:
        self._profile = torch.profiler.profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=True)
        self._profile.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        live: dict[int, Any] = {}  # ptr -> the profiler's allocation event
        running = highest = 0
        at_peak: dict[int, Any] = {}
        assert self._profile is not None, "__exit__ without __enter__"
        for node in allocation_events(self._profile):  # as AllocatorBytes counts them, keeping who is live
            size, ptr = node.extra_fields.alloc_size, node.extra_fields.ptr
            running += size
            if size > 0:
                live[ptr] = node
            else:
                live.pop(ptr, None)
            if running > highest:
                highest, at_peak = running, dict(live)
        self.rows = [
            Row(n.extra_fields.alloc_size, _op(n), src.label(_where(n, self.sources)), "", "", Category.TEMPORARIES)
            for n in at_peak.values()
        ]
        if sum(r.bytes for r in self.rows) != self.peak_bytes - self.baseline_bytes:  # frees of older storages
            self.notes.append(
                f"the allocations live at the peak hold {sum(r.bytes for r in self.rows)} bytes, "
                f"the peak is {self.peak_bytes - self.baseline_bytes} above the baseline"
            )
