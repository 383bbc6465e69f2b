"""A measurement on CUDA, simulated: the protocol's iterations (:mod:`.iterations`) replayed on the model of
the caching allocator (:mod:`.cuda_allocator`), for ``--predict --device cuda``.

The fake run of a case records, in order, the storages its build and one iteration allocate and
free (:class:`~topk_bench.measure.memory.AllocationTrace`). :class:`SimulatedCudaSteps` does each
step of :func:`topk_bench.measure.iterations.run` by replaying them, as
:class:`~topk_bench.measure.backends.CudaSteps` does each step on a GPU: so the iteration structure
(warm-up, gradients cleared, ``empty_cache`` and the peak reset, the timed iterations keeping their
losses) lives in one place, and a change to it moves measurements and predictions together.
"""

from __future__ import annotations

from typing import Sequence

from topk_bench.case import Case
from topk_bench.measure import iterations
from topk_bench.measure.cuda_allocator import FREE, CachingAllocator, Simulated
from topk_bench.types import Method

Event = tuple[int, int]  # (serial, nbytes): an allocation; (serial, FREE): its free


class _Replayed:
    """Stands in for a workload built on the simulated allocator: ``clear_grads`` frees what the last iteration
    left (its gradients), as a real workload's drops its gradients."""

    def __init__(self, steps: "SimulatedCudaSteps"):
        self._steps = steps

    def clear_grads(self) -> None:
        self._steps.clear()


class SimulatedCudaSteps(iterations.Steps):
    """The steps of a CUDA measurement on a fresh simulated allocator.

    ``setup``: the events of building the workload (what stays live is the baseline); ``body``: the
    events of one iteration from that state (serials distinct from the setup's; an iteration's free of a
    serial it did not allocate frees a setup one); ``loss``: the serial of the iteration's scalar loss,
    which a timed iteration keeps (``CudaSteps`` keeps each detached loss) and a warm-up frees.
    ``workspace``: sizes allocated once after the build and never freed (the cuBLAS workspaces, which
    the trace cannot see). ``empty_cache``: the measurement empties the cache before the peak reset.
    """

    def __init__(self, setup: Sequence[Event], body: Sequence[Event], *, loss: int | None = None,
                 empty_cache: bool = True, workspace: Sequence[int] = ()):
        self.setup, self.body, self.loss = list(setup), list(body), loss
        self.empty_cache, self.workspace = empty_cache, tuple(workspace)
        self.alloc = CachingAllocator()
        self._handles: dict = {}
        self._setup_keys: set = set()
        self._kept: set = set()  # the timed iterations' losses
        self._count = 0
        self.baseline = self.peak = self.reserved = None

    def _replay(self, events: Sequence[Event], tag) -> None:
        for serial, nbytes in events:
            key = (tag, serial)
            if nbytes == FREE:
                self.alloc.free(self._handles.pop(key if key in self._handles else (None, serial)))
            else:
                self._handles[key] = self.alloc.malloc(nbytes)

    def clear(self) -> None:
        """Free what the last iteration left but its kept loss (its gradients)."""
        for key in [k for k in self._handles if k not in self._setup_keys and k not in self._kept]:
            self.alloc.free(self._handles.pop(key))

    def _iterate(self, keep_loss: bool) -> None:
        self.clear()
        tag, self._count = self._count, self._count + 1
        self._replay(self.body, tag)
        if self.loss is not None:
            if keep_loss:
                self._kept.add((tag, self.loss))
            else:
                self.alloc.free(self._handles.pop((tag, self.loss)))

    def build(self) -> _Replayed:
        self._replay(self.setup, None)
        for size in self.workspace:
            self.alloc.malloc(size)
        self._setup_keys = set(self._handles)
        return _Replayed(self)

    def profile(self, wl) -> None:
        self._iterate(keep_loss=False)

    def warm_up(self, wl) -> None:
        self._iterate(keep_loss=False)

    def start(self, wl, *, reset_peak: bool) -> None:
        if reset_peak and self.empty_cache:
            self.alloc.empty_cache()
        self.baseline = self.alloc.allocated
        if reset_peak:
            self.alloc.reset_peak()

    def timed(self, wl) -> iterations.Sample:
        self._iterate(keep_loss=True)
        return 0.0, 0.0

    def finish(self, wl) -> None:
        self.peak, self.reserved = self.alloc.peak_allocated, self.alloc.peak_reserved

    def result(self) -> Simulated:
        return Simulated(self.baseline, self.peak, self.reserved)


def simulate(case: Case, setup: Sequence[Event], body: Sequence[Event], **options) -> Simulated:
    """What ``measure_cuda`` would read for ``case`` whose build and one iteration are ``setup`` and ``body``
    (``options``: :class:`SimulatedCudaSteps`'), its iterations run as :func:`iterations.run` runs them."""
    steps = SimulatedCudaSteps(setup, body, **options)
    iterations.run(case, steps)
    return steps.result()


def simulate_measurement(setup: Sequence[Event], body: Sequence[Event], *, warmup: int = 1, repeats: int = 1,
                         **options) -> Simulated:
    """:func:`simulate` for an event sequence of no particular case: our protocol, ``warmup`` and ``repeats``."""
    case = Case.make(suite="simulation", workload="simulation", impl="simulation", params={}, device="cuda",
                     method=Method.PREDICTED, warmup=warmup, repeats=repeats)
    return simulate(case, setup, body, **options)
