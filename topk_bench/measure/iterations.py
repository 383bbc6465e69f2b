"""The iteration structure of a measured case, per protocol: the one place that says which iterations run,
on which model and inputs, which are timed, and where the measured region starts.

A backend says how each step is done on its device (:class:`Steps`); :func:`run` decides which steps
run, and in what order:

- ``ours``: one workload, built once. A case that compiles on its first call (flex, or ``compile = true``):
  that call comes first, untimed, its seconds kept (``compile_s``). The warm-up: its first iteration
  profiles (FLOPs, ops; on the CPU, live bytes), more follow until both ``warmup`` iterations (the
  profiling one included) and ``warmup_s`` seconds of the others have run (triton.testing.do_bench warms
  up for 25 ms). The measured region starts (peaks restart), and its first iteration is untimed: on CUDA
  the cache was just emptied, so that iteration's blocks come from ``cudaMalloc``, which no timed one
  should pay (an H100's first sample was 1.3 to 3.9x the median); its time also fixes ``loops``, the
  iterations of each sample (``min_sample_s``: a sample lasts at least that long, as pyperf's and timeit's
  calibrated loops, so that a step of a millisecond is not judged by where one descheduling fell). Then
  ``repeats`` samples, back to back, each ``loops`` timed iterations and their mean: each is read once all
  have run (CUDA: one synchronisation at the end, so the device never waits for the host between them), and
  the row keeps every sample and their quantiles (median, interquartile range). When the timing needs a pass of its
  own (``timer = "cudagraph"``, ``flush_l2``), those eager iterations are the memory pass (the peaks are theirs, as
  without it), and the timing pass follows: the iteration captured in a CUDA graph (graphs allocate from a private
  pool: their memory is not the eager peak), then ``repeats`` samples, each a graph replay or an eager iteration, each
  after the device's cache is flushed (outside its timing). A device that captures no graph (the CPU) times eager
  iterations instead, and the row says so: what ran (timer, graph replays, dtype, whether the attention was compiled)
  is kept on the steps for the row, whatever the case asked (:mod:`topk_bench.child.as_asked`).
- ``paper``, the authors' loop: ``repeats`` (3) timed iterations, each on a model and inputs built just
  before it, outside the timed region, and released before the next is built. No warm-up: the first
  timed iteration is cold. Peaks are never reset, and are read after the last timed iteration. The
  profiling iteration runs after that, on a fresh workload, so that it warms up nothing.

Every iteration of a case starts from the same live set (parameters, inputs, kept tensors) and ends
with everything else freed, so the live-bytes peak of the profiling iteration is the peak of every
timed one, in either protocol.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import torch

import topk_bench.attention
from topk_bench.case import Case
from topk_bench.measure.contention import Sampler
from topk_bench.protocol import OURS, PAPER
from topk_bench.types import DeviceKind, Timer

Sample = tuple[float, float]  # (forward, backward) seconds of one timed iteration
Pending = Callable[[], Sample]  # a timed iteration's sample, to read once the device is synchronised


class Built(Protocol):
    """What the iterations use of a built workload: a :class:`~topk_bench.workloads.Workload`, or a simulation's
    stand-in."""

    def clear_grads(self) -> None: ...


W = TypeVar("W", bound=Built)


class Steps(Generic[W]):
    """How a backend does each step on its device (``start``, ``finish`` and ``flush`` do nothing unless
    overridden), on what its ``build`` returns.

    What the iterations did, as :func:`run` found it, is kept here for the row (the child reports what it
    measured with, not what the case asked): ``graph_replays``, ``compiled_graphs``, ``ran_dtype``.
    """

    # What times an eager timed iteration on this device; whether it captures an iteration in a CUDA graph.
    timer: Timer = Timer.PERF_COUNTER
    captures: bool = False
    # Seconds of the first call of an implementation that compiles (ours), compilation included; else None.
    compile_s: float | None = None
    # How many timed samples were replays of a captured graph (0: every one an eager iteration).
    graph_replays: int = 0
    # ``compile = true``: the graphs torch.compile made in the first call (0: the attention ran eagerly); else None.
    compiled_graphs: int | None = None
    # The dtype of the built workload's floating-point inputs (or, without any, its parameters).
    ran_dtype: str | None = None
    # Timed iterations in each sample (min_sample_s), each sample their mean.
    loops: int = 1
    # What the case's threads got of the machine around each timed iteration (set by :func:`run`).
    contention: Sampler

    def build(self) -> W:
        raise NotImplementedError

    def sync(self) -> None:
        """Wait for the device's queued work (CUDA); nothing on the CPU."""

    def now(self) -> float:
        """Seconds on the host's clock once the device's queued work is done: the warm-up's clock."""
        self.sync()
        return time.perf_counter()

    def profile(self, wl: W) -> None:
        """One untimed iteration that counts FLOPs (on the CPU, also live bytes)."""
        raise NotImplementedError

    def warm_up(self, wl: W) -> None:
        """One untimed iteration."""
        raise NotImplementedError

    def start(self, wl: W, *, reset_peak: bool) -> None:
        """The measured region starts, on ``wl``: what is live now is the baseline; peaks restart if asked."""

    def timed(self, wl: W) -> Pending:
        """One timed iteration, started; its sample is read after :meth:`sync`."""
        raise NotImplementedError

    def finish(self, wl: W) -> None:
        """The timed iterations are over, the last on ``wl``: read the peaks, then check its numbers."""

    def flush(self) -> None:
        """Flush the device's cache (zero a buffer larger than it), outside any timing."""

    def capture(self, wl: W) -> None:
        """Capture one iteration on ``wl`` in a CUDA graph, for :meth:`replay`."""
        raise NotImplementedError("only CUDA captures an iteration in a graph")

    def replay(self) -> Pending:
        """One timed replay of the captured iteration; its sample (all of it in the first place) after :meth:`sync`."""
        raise NotImplementedError("only CUDA replays a graph")


def _timed(steps: Steps[W], wl: W) -> Pending:
    """One timed iteration, the case's contention read around its dispatch (:mod:`topk_bench.measure.contention`:
    on the CPU the whole iteration; on CUDA the host's part)."""
    with steps.contention.around():
        return steps.timed(wl)


def compiles(case: Case) -> bool:
    """Whether the case compiles on its first call: ``compile = true``, or an implementation that compiles
    itself (registry ``compiles``: flex)."""
    return case.compile or (case.impl in topk_bench.attention.names() and topk_bench.attention.spec(case.impl).compiles)


def replays(case: Case, steps: Steps[Any] | None = None) -> bool:
    """Whether the samples are graph replays: asked (``timer = "cudagraph"``), and the device captures graphs
    (``steps``'s; without them, a CUDA device's). Where it does not (the CPU), the samples are eager, and the
    row says so (its ``timer``, ``graph_replays``; its status ``not_as_asked``)."""
    captures = steps.captures if steps is not None else case.device_kind is DeviceKind.CUDA
    return case.timer is Timer.CUDAGRAPH and captures


def own_timing_pass(case: Case, steps: Steps[Any] | None = None) -> bool:
    """Whether the timing needs a pass of its own after the memory pass (a CUDA graph, cache flushes)."""
    return replays(case, steps) or case.flush_l2


def dtype_of(wl: Any) -> str | None:
    """The dtype a built workload runs in: its first floating-point input's (or parameter's), as a DType spells it."""
    model = getattr(wl, "model", None)
    tensors = [*getattr(wl, "inputs", ()), *(model.parameters() if model is not None else ())]
    return next((str(t.dtype).removeprefix("torch.") for t in tensors if t.is_floating_point()), None)


def _graphs() -> int:
    """Graphs torch.compile has made in this process (dynamo's count)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _ours(case: Case, steps: Steps[W]) -> list[Sample]:
    if case.compile:
        # A cache hit makes no graph: start from none, so that the first call's count says whether the attention
        # was compiled at all (a child is a fresh process; in-process, the cost is a compilation).
        torch._dynamo.reset()
    wl = steps.build()
    steps.ran_dtype = dtype_of(wl)
    if compiles(case):  # its first call compiles: a warm-up of its own, whose seconds are compile_s
        graphs = _graphs()
        start = time.perf_counter()
        steps.warm_up(wl)
        steps.sync()
        steps.compile_s = time.perf_counter() - start
        if case.compile:
            steps.compiled_graphs = _graphs() - graphs
    _warm_up(case, steps, wl)
    wl.clear_grads()
    steps.start(wl, reset_peak=True)
    start = steps.now() if case.min_sample_s > 0 else 0.0  # (on CUDA a synchronisation: only when it is needed)
    steps.warm_up(wl)  # untimed: the first iteration after the reset allocates what the timed ones reuse
    if case.min_sample_s > 0:
        steps.loops = loops_for(case.min_sample_s, steps.now() - start)
    samples = _back_to_back(case, steps, lambda: _timed(steps, wl))
    steps.finish(wl)
    if own_timing_pass(case, steps):
        samples = _timing_pass(case, steps, wl)
    return samples


def _warm_up(case: Case, steps: Steps[W], wl: W) -> None:
    """The profiling iteration, then more until ``warmup`` iterations and ``warmup_s`` seconds of them."""
    steps.profile(wl)
    done, start = 1, steps.now()
    while done < case.warmup or steps.now() - start < case.warmup_s:
        steps.warm_up(wl)
        done += 1


# Iterations of one sample at most: a step the clock saw take no time must not loop for ever.
MAX_LOOPS = 10_000


def loops_for(min_sample_s: float, iteration_s: float) -> int:
    """Iterations a sample needs to last ``min_sample_s``, one iteration taking ``iteration_s`` (1 to
    :data:`MAX_LOOPS`)."""
    if min_sample_s <= 0 or iteration_s >= min_sample_s:
        return 1
    if iteration_s <= 0:
        return MAX_LOOPS
    return min(MAX_LOOPS, math.ceil(min_sample_s / iteration_s))


def _back_to_back(case: Case, steps: Steps[Any], run: Callable[[], Pending], flush: bool = False) -> list[Sample]:
    """``repeats`` samples of ``steps.loops`` timed iterations (``run``) each, queued back to back (each
    iteration after a cache flush when asked), then one synchronisation, then each sample: the mean of its
    iterations."""
    pending = []
    for _ in range(case.repeats * steps.loops):
        if flush:
            steps.flush()
        pending.append(run())
    steps.sync()
    reads = [read() for read in pending]
    loops = steps.loops
    return [_mean(reads[i : i + loops]) for i in range(0, len(reads), loops)]


def _mean(reads: list[Sample]) -> Sample:
    return sum(f for f, _ in reads) / len(reads), sum(b for _, b in reads) / len(reads)


def _timing_pass(case: Case, steps: Steps[W], wl: W) -> list[Sample]:
    """The samples of a timing pass after the memory pass: graph replays or eager iterations, flushed if asked."""
    if replays(case, steps):
        steps.capture(wl)
        samples = _back_to_back(case, steps, steps.replay, flush=case.flush_l2)
        steps.graph_replays = len(samples)
        return samples
    return _back_to_back(case, steps, lambda: _timed(steps, wl), flush=case.flush_l2)


def _paper(case: Case, steps: Steps[W]) -> list[Sample]:
    samples: list[Sample] = []
    wl: W | None = None
    for i in range(case.repeats):
        wl = None  # the last one freed before the next is built, as their `del Q, model, out, loss`
        wl = steps.build()  # outside the timed region, as their get_inputs()
        steps.ran_dtype = dtype_of(wl)
        if i == 0:
            steps.start(wl, reset_peak=False)
        read = _timed(steps, wl)
        steps.sync()  # their loop synchronised around each iteration
        samples.append(read())
    assert wl is not None, "repeats >= 1"
    steps.finish(wl)
    wl = None
    steps.profile(steps.build())
    return samples


STRUCTURES: dict[str, Callable[[Case, Steps[Any]], list[Sample]]] = {OURS.name: _ours, PAPER.name: _paper}


def run(case: Case, steps: Steps[Any]) -> list[Sample]:
    """Run ``case``'s iterations in its protocol's structure; the samples of the timed ones."""
    try:
        structure = STRUCTURES[case.protocol]
    except KeyError:
        raise ValueError(f"unknown protocol {case.protocol!r} (known: {', '.join(STRUCTURES)})") from None
    steps.contention = Sampler(torch.get_num_threads())
    return structure(case, steps)
