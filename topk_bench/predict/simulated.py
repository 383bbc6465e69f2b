"""A measurement on CUDA, simulated: the protocol's iterations (:mod:`.iterations`) replayed on the model of
the caching allocator (:mod:`.allocator`), for ``--predict --device cuda``.

The fake run of a case records, in order, the storages its build and one iteration allocate and
free (:class:`~topk_bench.predict.trace.AllocationTrace`). :class:`SimulatedCudaSteps` does each
step of :func:`topk_bench.measure.iterations.run` by replaying them, as
:class:`~topk_bench.measure.backends.CudaSteps` does each step on a GPU: so the iteration structure
(warm-up, gradients cleared, ``empty_cache`` and the peak reset, the untimed iteration after it, the timed
iterations keeping their losses) lives in one place, and a change to it moves measurements and predictions
together. Time is simulated too, as one second per iteration: a warm-up by time then runs as many
iterations as its count asks, at least two when it asks for any seconds (every warm-up iteration frees all
it allocates, so their number changes no peak). The timing pass after the peaks are read (a CUDA graph's
replays, cache flushes) changes nothing that is read.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from topk_bench.case import Case
from topk_bench.measure import iterations
from topk_bench.predict.allocator import FREE, CachingAllocator, Simulated
from topk_bench.types import Method

Event = tuple[int, int]  # (serial, nbytes): an allocation; (serial, FREE): its free


class _Replayed:
    """Stands in for a workload built on the simulated allocator: ``clear_grads`` frees what the last iteration
    left (its gradients), as a real workload's drops its gradients."""

    def __init__(self, steps: SimulatedCudaSteps):
        self._steps = steps

    def clear_grads(self) -> None:
        self._steps.clear()


class SimulatedCudaSteps(iterations.Steps[_Replayed]):
    """The steps of a CUDA measurement on a fresh simulated allocator.

    ``setup``: the events of building the workload (what stays live is the baseline); ``body``: the
    events of one iteration from that state (serials distinct from the setup's; an iteration's free of a
    serial it did not allocate frees a setup one); ``loss``: the serial of the iteration's scalar loss,
    which a timed iteration keeps (``CudaSteps`` keeps each detached loss) and a warm-up frees.
    ``profile``: the events and loss serial of the profiling iteration, when they differ from ``body``'s
    (``CudaSteps.profile`` runs under ``FlopCounterMode``, whose module hooks keep some gradients longer).
    ``persistent``: serials of the events (the profiling iteration's, as a rule) that are never freed, not even
    with the gradients: the library workspaces a first call allocates and keeps (cuBLAS, cuBLASLt).
    ``empty_cache``: the measurement empties the cache before the peak reset.
    As :class:`~topk_bench.measure.backends.CudaSteps` reads them: the baseline is what the build left
    allocated; the workspace is what the warm-up left allocated besides (gradients cleared).
    """

    def __init__(
        self,
        setup: Sequence[Event],
        body: Sequence[Event],
        *,
        loss: int | None = None,
        empty_cache: bool = True,
        persistent: Collection[int] = (),
        profile: tuple[Sequence[Event], int | None] | None = None,
    ):
        self.setup, self.body, self.loss = list(setup), list(body), loss
        self.profiled = (list(profile[0]), profile[1]) if profile is not None else (self.body, loss)
        self.empty_cache, self.persistent = empty_cache, frozenset(persistent)
        self.alloc = CachingAllocator()
        self._handles: dict = {}
        self._setup_keys: set = set()
        self._kept: set = set()  # the timed iterations' losses
        self._count = 0  # iterations so far: also the simulated clock, one second each
        self.after_build: int | None = None
        self.baseline: int | None = None
        self.workspace: int | None = None
        self.peak: int | None = None
        self.reserved: int | None = None

    def _replay(self, events: Sequence[Event], tag) -> None:
        for serial, nbytes in events:
            key = (tag, serial)
            if nbytes == FREE:
                self.alloc.free(self._handles.pop(key if key in self._handles else (None, serial)))
            else:
                self._handles[key] = self.alloc.malloc(nbytes)

    def clear(self) -> None:
        """Free what the last iteration left but its kept loss and the workspaces (its gradients)."""
        for key in [
            k
            for k in self._handles
            if k not in self._setup_keys and k not in self._kept and k[1] not in self.persistent
        ]:
            self.alloc.free(self._handles.pop(key))

    def _iterate(self, keep_loss: bool, profiled: bool = False) -> None:
        self.clear()
        tag, self._count = self._count, self._count + 1
        body, loss = self.profiled if profiled else (self.body, self.loss)
        self._replay(body, tag)
        if loss is not None:
            if keep_loss:
                self._kept.add((tag, loss))
            else:
                self.alloc.free(self._handles.pop((tag, loss)))

    def build(self) -> _Replayed:
        self._replay(self.setup, None)
        self.after_build = self.alloc.allocated
        self._setup_keys = set(self._handles)
        return _Replayed(self)

    def profile(self, wl) -> None:
        self._iterate(keep_loss=False, profiled=True)

    def warm_up(self, wl) -> None:
        self._iterate(keep_loss=False)

    def now(self) -> float:
        return float(self._count)

    def start(self, wl, *, reset_peak: bool) -> None:
        assert self.after_build is not None, "start() after build()"
        self.baseline = self.after_build
        if reset_peak:
            self.workspace = self.alloc.allocated - self.after_build
            if self.empty_cache:
                self.alloc.empty_cache()
            self.alloc.reset_peak()

    def timed(self, wl) -> iterations.Pending:
        self._iterate(keep_loss=True)
        return lambda: (0.0, 0.0)

    def finish(self, wl) -> None:
        self.peak, self.reserved = self.alloc.peak_allocated, self.alloc.peak_reserved

    def capture(self, wl) -> None:
        """After the peaks are read: nothing to simulate (the graph's private pool is no peak of the row)."""

    def replay(self) -> iterations.Pending:
        return lambda: (0.0, 0.0)

    def result(self) -> Simulated:
        assert self.baseline is not None and self.peak is not None and self.reserved is not None, "after finish()"
        return Simulated(self.baseline, self.peak, self.reserved, self.workspace)


def simulate(
    case: Case,
    setup: Sequence[Event],
    body: Sequence[Event],
    *,
    make_steps: Callable[..., SimulatedCudaSteps] = SimulatedCudaSteps,
    **options,
) -> Simulated:
    """What ``measure_cuda`` would read for ``case`` whose build and one iteration are ``setup`` and ``body``
    (``options``: :class:`SimulatedCudaSteps`'), its iterations run as :func:`iterations.run` runs them;
    ``make_steps``: the steps class (a profile's keeps the blocks of the peak)."""
    steps = make_steps(setup, body, **options)
    iterations.run(case, steps)
    return steps.result()


def simulate_measurement(
    setup: Sequence[Event], body: Sequence[Event], *, warmup: int = 1, repeats: int = 1, **options
) -> Simulated:
    """:func:`simulate` for an event sequence of no particular case: our protocol, ``warmup`` and ``repeats``."""
    case = Case.make(
        suite="simulation",
        workload="simulation",
        impl="simulation",
        params={},
        device="cuda",
        method=Method.PREDICTED,
        warmup=warmup,
        repeats=repeats,
    )
    return simulate(case, setup, body, **options)
