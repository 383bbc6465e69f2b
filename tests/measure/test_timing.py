"""How a case is timed (issue 26), run on the CPU through the CUDA steps with a stand-in for ``torch.cuda``.

The stand-in is injected into :class:`~topk_bench.measure.backends.CudaSteps` (``cuda=``, ``clock=``): its
clock advances by a fixed time per eager iteration and per graph replay, its events read that clock when
recorded, and every call it gets is logged in order. The workload is built on the CPU, so the iterations
really run; what is checked is the control flow of :mod:`topk_bench.measure.iterations` as the CUDA steps
do it: the warm-up by time and count, the untimed iteration after the peak reset, the timed iterations back
to back (one synchronisation), the memory pass before a CUDA graph is captured and replayed, and the cache
flush between timed iterations, outside the events.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import replace

import pytest
import torch

from topk_bench.case import Case
from topk_bench.measure import backends, iterations
from topk_bench.run.resolve import Flags
from topk_bench.types import Timer

STEP_S = 0.010  # an eager iteration on the stand-in GPU
REPLAY_S = 0.002  # a replay of the captured iteration (no host dispatch)
FLUSH_S = 0.004  # a cache flush: inside an iteration's events, it would show in its sample
L2_BYTES = 4096


class FakeRuntime:
    """What CudaSteps calls of ``torch.cuda``, logging each call; a clock that eager iterations and replays move."""

    def __init__(self):
        self.t = 0.0
        self.calls: list[tuple] = []
        self.capturing = False
        self.streams: list[str] = ["current"]

    def clock(self) -> float:
        return self.t

    def synchronize(self, device=None):
        self.calls.append(("sync",))

    def memory_allocated(self, device=None):
        return 1000

    def empty_cache(self):
        self.calls.append(("empty_cache",))

    def reset_peak_memory_stats(self, device=None):
        self.calls.append(("reset_peak",))

    def max_memory_allocated(self, device=None):
        self.calls.append(("read_peak",))
        return 5000

    def max_memory_reserved(self, device=None):
        return 8192

    def get_device_properties(self, device=None):
        return type("Properties", (), {"L2_cache_size": L2_BYTES})()

    def Event(self, enable_timing=False):
        runtime = self

        class Event:
            def record(self):
                runtime.calls.append(("record",))
                self.at = runtime.t

            def elapsed_time(self, other):
                return 1e3 * (other.at - self.at)  # milliseconds

        return Event()

    def current_stream(self, device=None):
        return FakeStream(self, self.streams[-1])

    def Stream(self, device=None):
        return FakeStream(self, "side")

    @contextlib.contextmanager
    def stream(self, s):
        self.streams.append(s.name)
        self.calls.append(("stream", s.name))
        try:
            yield
        finally:
            self.streams.pop()
            self.calls.append(("stream end", s.name))

    def CUDAGraph(self):
        return FakeGraph(self)

    @contextlib.contextmanager
    def graph(self, g):
        self.capturing = True
        self.calls.append(("capture",))
        try:
            yield
        finally:
            self.capturing = False
            self.calls.append(("capture end",))


class FakeStream:
    def __init__(self, runtime, name):
        self.runtime, self.name = runtime, name

    def wait_stream(self, other):
        self.runtime.calls.append(("wait", self.name, other.name))


class FakeGraph:
    def __init__(self, runtime):
        self.runtime = runtime

    def replay(self):
        self.runtime.calls.append(("replay",))
        self.runtime.t += REPLAY_S


@pytest.fixture
def runtime(monkeypatch):
    """The stand-in, with every iteration of the CUDA steps logged (timed or not, captured or not) and
    moving its clock by STEP_S (a captured iteration runs no kernel: it does not move it)."""
    fake = FakeRuntime()
    real = backends.iteration

    def logged(wl, case, clock=None, losses=None):
        kind = "captured" if fake.capturing else ("timed" if clock else "untimed")
        fake.calls.append(("iteration", kind, fake.streams[-1]))
        if clock:
            clock()  # forward starts
        if not fake.capturing:
            fake.t += STEP_S
        real(wl, case, None, losses)
        if clock:
            clock()  # forward ends, backward starts: the stand-in times it all as the forward
            clock()
        return 0.0, 0.0

    monkeypatch.setattr(backends, "iteration", logged)
    return fake


class ObservedSteps(backends.CudaSteps):
    """The CUDA steps on the CPU, logging each cache flush; a flush moves the stand-in's clock by FLUSH_S."""

    def flush(self):
        self.cuda.calls.append(("flush",))
        self.cuda.t += FLUSH_S
        super().flush()


def make_case(**fields) -> Case:
    base = dict(
        suite="t",
        workload="mha",
        impl="vanilla",
        params={"seq_len": 8, "d_model": 8, "heads": 2},
        device="cuda",
        warmup=2,
        warmup_s=0.025,
        repeats=3,
    )
    return Case.make(**{**base, **fields})


def run(case: Case, runtime: FakeRuntime) -> tuple[ObservedSteps, list[iterations.Sample]]:
    steps = ObservedSteps(case, torch.device("cpu"), cuda=runtime, clock=runtime.clock)
    return steps, iterations.run(case, steps)


def kinds(calls: list[tuple]) -> list[str]:
    """The iterations in order: profile excluded (its own mode), then untimed, timed, captured."""
    return [c[1] for c in calls if c[0] == "iteration"]


def test_the_warm_up_lasts_its_seconds_when_they_take_more_iterations_than_its_count(runtime):
    # 2 iterations asked, 25 ms of them: at 10 ms each, the profiling one and 3 more (10, 20, 30 ms >= 25).
    run(make_case(), runtime)
    reset = runtime.calls.index(("reset_peak",))
    assert kinds(runtime.calls[:reset]) == ["untimed"] * 4
    # Every clock reading waits for the device first: the warm-up is timed as the GPU ran it.
    reads = [i for i, c in enumerate(runtime.calls[:reset]) if c == ("sync",)]
    assert len(reads) >= 4


def test_the_warm_up_lasts_its_count_when_that_is_longer(runtime):
    run(make_case(warmup=6), runtime)
    reset = runtime.calls.index(("reset_peak",))
    assert kinds(runtime.calls[:reset]) == ["untimed"] * 6


def test_a_slow_iteration_is_warmed_up_twice_at_least(runtime, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "STEP_S", 1.0)  # one iteration is longer than 25 ms
    run(make_case(), runtime)
    reset = runtime.calls.index(("reset_peak",))
    assert kinds(runtime.calls[:reset]) == ["untimed"] * 2


def test_an_untimed_iteration_follows_the_reset_and_the_timed_ones_run_back_to_back(runtime):
    steps, samples = run(make_case(), runtime)
    reset = runtime.calls.index(("reset_peak",))
    assert runtime.calls[reset - 1] == ("empty_cache",)
    after = runtime.calls[reset + 1 :]
    # First an untimed iteration: the blocks the emptied cache gave back are allocated again outside the timing.
    assert after[0] == ("iteration", "untimed", "current")
    # Then 3 timed iterations, 3 events each, no synchronisation between them; one at the end, then the peaks.
    timed = after[1 : after.index(("sync",))]
    assert timed == [("iteration", "timed", "current"), ("record",), ("record",), ("record",)] * 3
    assert after[after.index(("sync",)) + 1] == ("read_peak",)
    # Each sample read from its own events once all ran: STEP_S each, as the stand-in's clock moved.
    assert samples == [pytest.approx((STEP_S, 0.0))] * 3
    assert ("flush",) not in runtime.calls and steps.graph is None


def test_the_cache_is_flushed_before_each_timed_iteration_outside_its_events_after_the_peaks(runtime):
    steps, samples = run(make_case(flush_l2=True), runtime)
    peaks = runtime.calls.index(("read_peak",))
    # The memory pass is as without a flush (the flush buffer is no peak of the row) ...
    assert ("flush",) not in runtime.calls[:peaks]
    # ... then a timing pass: each timed iteration's events come after a flush; the flush is in none of them.
    timing = runtime.calls[peaks + 1 :]
    assert (
        timing[: timing.index(("sync",))]
        == [("flush",), ("iteration", "timed", "current"), ("record",), ("record",), ("record",)] * 3
    )
    assert timing[timing.index(("sync",)) :] == [("sync",)]
    # The buffer zeroed is larger than the device's L2 (twice).
    assert steps._flush.numel() * steps._flush.element_size() == 2 * L2_BYTES
    assert samples == [pytest.approx((STEP_S, 0.0))] * 3


def test_a_flush_inside_the_events_would_show_in_the_samples(runtime):
    """The stand-in tells a flush outside the timing from one inside: the checks above can fail."""

    class FlushInside(ObservedSteps):
        def timed(self, wl):  # as CudaSteps.timed, but flushing right after the start event is recorded
            start, mid, end = self._events(3)
            marks = iter((start, mid, end))

            def clock():
                event = next(marks)
                event.record()
                if event is start:
                    self.flush()
                return 0.0

            backends.iteration(wl, self.case, clock=clock, losses=self.losses)
            return lambda: (start.elapsed_time(mid) / 1e3, mid.elapsed_time(end) / 1e3)

    case = make_case(flush_l2=True)
    samples = iterations.run(case, FlushInside(case, torch.device("cpu"), cuda=runtime, clock=runtime.clock))
    assert samples == [pytest.approx((STEP_S + FLUSH_S, 0.0))] * 3


def test_a_cuda_graph_is_captured_after_the_memory_pass_and_replayed_for_each_sample(runtime):
    steps, samples = run(make_case(timer=Timer.CUDAGRAPH), runtime)
    calls = runtime.calls
    peaks = calls.index(("read_peak",))
    # The memory pass is the eager one, as with events: an untimed iteration after the reset, 3 eager ones.
    reset = calls.index(("reset_peak",))
    assert kinds(calls[reset:peaks]) == ["untimed", "timed", "timed", "timed"]
    # Then, as torch.cuda.graph's documentation and triton's do_bench_cudagraph: a side stream that waits for
    # the current one, eager iterations on it, the current stream waiting for it, one iteration captured.
    graph = calls[peaks + 1 : calls.index(("capture end",)) + 1]
    assert graph == [
        ("wait", "side", "current"),
        ("stream", "side"),
        ("iteration", "untimed", "side"),
        ("iteration", "untimed", "side"),
        ("stream end", "side"),
        ("wait", "current", "side"),
        ("capture",),
        ("iteration", "captured", "current"),
        ("capture end",),
    ]
    # Then each sample is one replay between two events, back to back, one synchronisation at the end.
    replays = calls[calls.index(("capture end",)) + 2 :]  # after the synchronisation that ends the capture
    assert replays == [("record",), ("replay",), ("record",)] * 3 + [("sync",)]
    assert samples == [pytest.approx((REPLAY_S, 0.0))] * 3


def test_a_cuda_graph_with_a_cache_flush_flushes_between_replays(runtime):
    _, samples = run(make_case(timer=Timer.CUDAGRAPH, flush_l2=True), runtime)
    replays = runtime.calls[runtime.calls.index(("capture end",)) + 2 :]
    assert replays == [("flush",), ("record",), ("replay",), ("record",)] * 3 + [("sync",)]
    assert samples == [pytest.approx((REPLAY_S, 0.0))] * 3


def test_a_case_that_cannot_be_captured_is_unsupported(runtime):
    from topk_bench.errors import Unsupported

    @contextlib.contextmanager
    def refusing(g):
        raise RuntimeError("operation not permitted when stream is capturing")
        yield

    runtime.graph = refusing
    with pytest.raises(Unsupported, match="cannot be captured in a CUDA graph .operation not permitted"):
        run(make_case(timer=Timer.CUDAGRAPH), runtime)


def test_measure_cuda_records_the_timer_and_keeps_no_forward_backward_split_for_graph_replays(runtime, monkeypatch):
    """measure_cuda end to end on the stand-in (the workload built on the CPU)."""
    real_build = backends.build
    monkeypatch.setattr(backends, "build", lambda case, device: real_build(case, "cpu"))
    runtime.is_available = lambda: True
    runtime.current_device = lambda: 0
    runtime.device = lambda device: contextlib.nullcontext()
    graph = backends.measure_cuda(make_case(timer=Timer.CUDAGRAPH), None, cuda=runtime)
    events = backends.measure_cuda(make_case(), None, cuda=runtime)
    assert graph.status == events.status == "ok"
    assert graph.extra["timer"] == "cudagraph" and events.extra["timer"] == "events"
    assert graph.times_s == pytest.approx([REPLAY_S] * 3) and graph.fwd_times_s == graph.bwd_times_s == []
    assert events.times_s == pytest.approx([STEP_S] * 3) and len(events.fwd_times_s) == 3
    # The memory is the eager pass's, whatever the timer.
    assert (graph.peak_bytes, graph.reserved_bytes, graph.baseline_bytes) == (
        events.peak_bytes,
        events.reserved_bytes,
        events.baseline_bytes,
    )
    assert graph.extra["ops_per_iter"] == events.extra["ops_per_iter"] > 0


# -- the settings: bench.toml < suite < flags, resolved once --------------------------------------------------


def timing_suite(tmp_path, keys: str = "") -> str:
    path = tmp_path / "s.toml"
    path.write_text(
        f'name = "s"\nworkload = "mha"\n{keys}\n[shape]\nd_model = 8\nheads = 2\n[sweep]\nseq_len = [16]\n'
        '[[impl]]\nname = "vanilla"\n'
    )
    return str(path)


def test_the_defaults_warm_up_two_iterations_and_25_ms(tmp_path):
    from topk_bench.run.plan import plan

    (case,) = plan(timing_suite(tmp_path), Flags(device="cpu", out=tmp_path / "o")).cases
    assert (case.warmup, case.warmup_s, case.timer, case.flush_l2) == (2, 0.025, None, False)


def test_a_cuda_timer_asked_of_a_cpu_run_is_said_and_left_out(tmp_path):
    from topk_bench.run.plan import plan

    path = timing_suite(tmp_path, 'timer = "cudagraph"\nflush_l2 = true\nwarmup_s = 0.5')
    measured = plan(path, Flags(device="cpu", out=tmp_path / "o"))
    (case,) = measured.cases
    assert (case.timer, case.flush_l2, case.warmup_s) == (None, True, 0.5)  # the CPU flushes its own cache
    assert any("timer = cudagraph: a CUDA timer; this CPU run uses perf_counter" in n for n in measured.notes)
    # A prediction times nothing: neither enters its case (nor its id).
    (predicted,) = plan(path, Flags(predict=True, device="cuda", out=tmp_path / "o")).cases
    (tmp_path / "p").mkdir()
    (plain,) = plan(timing_suite(tmp_path / "p"), Flags(predict=True, device="cuda", out=tmp_path / "o")).cases
    assert (predicted.timer, predicted.flush_l2) == (None, False) and predicted.case_id == plain.case_id
    # Flags win over the suite.
    (flagged,) = plan(path, Flags(device="cpu", out=tmp_path / "o", warmup_s=0.1, flush_l2=False)).cases
    assert (flagged.warmup_s, flagged.flush_l2) == (0.1, False)


def test_a_measured_cuda_run_keeps_the_timer_asked(tmp_path):
    from topk_bench.run import resolve
    from topk_bench.suite.load import read_suite
    from topk_bench.suite.settings import Settings

    suite = read_suite(timing_suite(tmp_path, 'timer = "cudagraph"'))
    timing = resolve.Timing(warmup_s=0.025, min_sample_s=0.0, timer=Timer.CUDAGRAPH, flush_l2=False)
    assert resolve._timing(suite, resolve.Flags(), Settings(), "cuda") == (timing, [])
    flags = resolve.Flags(timer="events", flush_l2=True)
    assert resolve._timing(suite, flags, Settings(), "cuda") == (replace(timing, timer=Timer.EVENTS, flush_l2=True), [])


def test_a_cpu_timer_asked_of_a_cuda_run_is_said_and_left_out(tmp_path):
    from topk_bench.run import resolve
    from topk_bench.suite.load import read_suite
    from topk_bench.suite.settings import Settings

    suite = read_suite(timing_suite(tmp_path, 'timer = "process_time"\nmin_sample_s = 0.05'))
    timing, notes = resolve._timing(suite, resolve.Flags(), Settings(), "cuda")
    assert (timing.timer, timing.min_sample_s) == (None, 0.05)
    assert notes == ["timer = process_time: a CPU timer; this CUDA run uses events"]
    timing, notes = resolve._timing(suite, resolve.Flags(), Settings(), "cpu")
    assert (timing.timer, notes) == (Timer.PROCESS_TIME, [])
    # A prediction times nothing: no timer, no sample length.
    timing, _ = resolve._timing(suite, resolve.Flags(predict=True), Settings(), "cpu")
    assert (timing.timer, timing.min_sample_s) == (None, 0.0)


def test_timer_and_flush_enter_a_case_id_only_when_set():
    case = make_case()
    assert case.case_id == replace(case, timer=Timer.EVENTS).case_id  # the default, spelled out
    ids = {
        case.case_id,
        replace(case, timer=Timer.CUDAGRAPH).case_id,
        replace(case, flush_l2=True).case_id,
        replace(case, compile=True).case_id,
        replace(case, compile=True, compile_mode="max-autotune").case_id,
        replace(case, device="cpu", timer=Timer.PROCESS_TIME).case_id,
    }
    assert len(ids) == 6
    # CPU seconds are another quantity than wall seconds; perf_counter is the CPU's default, spelled out.
    cpu = replace(case, device="cpu")
    assert cpu.case_id == replace(cpu, timer=Timer.PERF_COUNTER).case_id
    # Warm-up and sample settings are no part of what a case is (re-running with another warm-up resumes).
    assert case.case_id == replace(case, warmup=7, warmup_s=1.0, min_sample_s=0.05).case_id


def test_a_sample_runs_the_iteration_back_to_back_until_it_lasts_min_sample_s(runtime):
    # 10 ms an iteration, 35 ms a sample: 4 iterations each (the untimed one after the reset counts them),
    # 3 samples of 4, each their mean, read after one synchronisation.
    steps, samples = run(make_case(min_sample_s=0.035), runtime)
    assert steps.loops == 4
    reset = runtime.calls.index(("reset_peak",))
    after = runtime.calls[reset + 1 :]
    # The untimed iteration is timed by the host's clock, which waits for the device before each reading.
    assert after[:3] == [("sync",), ("iteration", "untimed", "current"), ("sync",)]
    timed = after[3 : after.index(("sync",), 3)]
    assert timed == [("iteration", "timed", "current"), ("record",), ("record",), ("record",)] * 12
    assert samples == [pytest.approx((STEP_S, 0.0))] * 3


@pytest.mark.parametrize(
    ("min_sample_s", "iteration_s", "loops"),
    [(0, 0.01, 1), (0.05, 0.01, 5), (0.05, 0.011, 5), (0.05, 0.2, 1), (0.05, 0.0, 10_000), (60, 1e-6, 10_000)],
)
def test_loops_are_the_fewest_iterations_that_last_the_sample(min_sample_s, iteration_s, loops):
    assert iterations.loops_for(min_sample_s, iteration_s) == loops


def test_a_cpu_case_timed_by_process_time_reads_the_process_clock_and_says_so(monkeypatch):
    from topk_bench.child.execute import execute
    from topk_bench.results import columns as col

    ticks = iter(range(10_000))
    monkeypatch.setattr(backends.time, "process_time", lambda: float(next(ticks)))
    case = make_case(device="cpu", timer="process_time", warmup=1, warmup_s=0.0, repeats=3)
    m = execute(case)
    # The stand-in process clock ticks once a reading: 1 s forward, 1 s backward (mha: fwd_bwd).
    assert m.status == "ok" and m.times_s == [2.0, 2.0, 2.0]
    assert m.extra[col.TIMER] == Timer.PROCESS_TIME and m.extra[col.LOOPS] == 1


def test_a_cudagraph_case_read_from_json_is_replayed_and_its_row_counts_the_replays(runtime, monkeypatch):
    """The child reads its case from the JSON the parent wrote: the timer it reads is the one it times with."""
    real_build = backends.build
    monkeypatch.setattr(backends, "build", lambda case, device: real_build(case, "cpu"))
    runtime.is_available = lambda: True
    runtime.current_device = lambda: 0
    runtime.device = lambda device: contextlib.nullcontext()
    sent = make_case(timer=Timer.CUDAGRAPH)
    child = Case.from_json(sent.to_json())
    assert child.case_id == sent.case_id
    graph = backends.measure_cuda(child, None, cuda=runtime)
    assert runtime.calls.count(("replay",)) == 3
    assert graph.extra["timer"] is Timer.CUDAGRAPH and graph.extra["graph_replays"] == 3
    events = backends.measure_cuda(Case.from_json(make_case().to_json()), None, cuda=runtime)
    assert events.extra["timer"] is Timer.EVENTS and events.extra["graph_replays"] == 0
