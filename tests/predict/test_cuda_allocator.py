"""The simulated CUDA caching allocator: its rules one by one, and allocation sequences replayed against an H100."""

import gzip
import json

import pytest

from locations import TESTS
from topk_bench.predict.allocator import FREE, MIB, CachingAllocator
from topk_bench.predict.simulated import simulate_measurement

DATA = TESTS / "data"


def test_small_requests_are_512_byte_blocks_of_2_mib_segments():
    a = CachingAllocator()
    blocks = [a.malloc(n) for n in (1, 512, 513, MIB)]
    assert [b.size for b in blocks] == [512, 512, 1024, MIB]
    assert a.allocated == 512 + 512 + 1024 + MIB and a.reserved == 2 * MIB
    assert a.malloc(MIB).size == MIB and a.reserved == 4 * MIB  # 2 MiB - 2 KiB left: a second segment
    assert a.malloc(0) is None and a.allocated == 2 * MIB + 2048


def test_large_requests_take_20_mib_segments_below_10_mib_and_their_own_above():
    a = CachingAllocator()
    a.malloc(MIB + 1)
    assert a.reserved == 20 * MIB and a.allocated == MIB + 512
    a.malloc(10 * MIB)
    assert a.reserved == 20 * MIB  # a large request may take the free rest of a 20 MiB segment
    b = CachingAllocator()
    first = b.malloc(10 * MIB)
    assert b.reserved == 10 * MIB  # from 10 MiB on, a segment of the request rounded up to 2 MiB
    block = b.malloc(11 * MIB)
    # 12 MiB segment; a remainder of 1 MiB is not more than 1 MiB: the whole block is handed out.
    assert b.reserved == 22 * MIB and block.size == 12 * MIB and b.allocated == 22 * MIB
    assert block.address + block.size == first.address  # a new segment lies just below the last one


def test_best_fit_reuse_splitting_and_coalescing_within_a_segment():
    a = CachingAllocator()
    x, y, z = a.malloc(4 * MIB), a.malloc(6 * MIB), a.malloc(2 * MIB)  # one 20 MiB segment: 4 | 6 | 2 | 8 free
    assert a.reserved == 20 * MIB and len(a.segments) == 1
    a.free(y)
    w = a.malloc(5 * MIB)  # best fit: the 6 MiB hole (not the 8 MiB tail); remainder 1 MiB: not split
    assert w.address == y.address and w.size == 6 * MIB and a.reserved == 20 * MIB
    a.free(w), a.free(x)  # 4 and 6 coalesce into 10 MiB
    assert sorted(b.size for b in a.segments[0].blocks() if not b.allocated) == [8 * MIB, 10 * MIB]
    v = a.malloc(9 * MIB)  # fits only the coalesced 10 MiB block
    assert v.address == a.segments[0].address and a.reserved == 20 * MIB
    a.free(v), a.free(z)
    assert [b.size for b in a.segments[0].blocks()] == [20 * MIB]


def test_empty_cache_returns_only_segments_without_a_live_block_and_peaks_reset_to_now():
    a = CachingAllocator()
    keep = a.malloc(MIB + 1)
    a.free(a.malloc(30 * MIB))
    a.free(a.malloc(100))
    assert a.reserved == 52 * MIB
    a.empty_cache()
    assert a.reserved == 20 * MIB and a.peak_reserved == 52 * MIB
    a.reset_peak()
    assert (a.peak_allocated, a.peak_reserved) == (keep.size, 20 * MIB)
    with pytest.raises(ValueError):
        a.free(a.malloc(1)) or a.free(keep) or a.free(keep)


def _replay(ops):
    a, live = CachingAllocator(), []
    for op in ops:
        if op[0] == "e":
            a.empty_cache()
        elif op[0] == "m":
            live.append(a.malloc(op[1]))
        else:
            a.free(live.pop(op[1]))
        yield a.allocated, a.reserved


def test_random_sequences_replayed_on_an_h100_agree_step_by_step():
    """8 sequences of 2,000 random mallocs (1 B to 80 MiB, the pool boundaries included), frees and
    ``empty_cache`` calls, run on an H100 (torch 2.11) with memory_allocated/reserved read after each step.
    Allocated and reserved agree at every step of every sequence. (Where cudaMalloc places a segment decides
    which of two equal free blocks is taken: with new segments at the lowest free gap rather than below the
    last one, an ``empty_cache`` in 2 sequences releases one 2 MiB segment more or less than the real one.)"""
    data = json.loads(gzip.decompress((DATA / "h100-allocator-sequences.json.gz").read_bytes()))
    exact = 0
    for seq in data["sequences"]:
        simulated = list(_replay(seq["ops"]))
        real = [tuple(r) for r in seq["allocated_reserved"]]
        assert [s[0] for s in simulated] == [r[0] for r in real], f"allocated, sequence {seq['seed']}"
        exact += simulated == real
    assert exact == 8


def test_a_measurement_keeps_timed_losses_frees_gradients_and_can_empty_the_cache():
    setup = [(1, 3 * MIB), (2, 100), (3, 5 * MIB), (3, FREE)]  # a parameter, an input, a freed temporary
    body = [(10, 8 * MIB), (11, 4), (12, 3 * MIB), (10, FREE)]  # activation, loss, gradient (kept), freed
    kept = simulate_measurement(setup, body, loss=11, warmup=2, repeats=3, empty_cache=False)
    # baseline: the parameter and the input; each timed iteration adds its 512-byte loss.
    assert kept.baseline_bytes == 3 * MIB + 512
    assert kept.peak_bytes == 3 * MIB + 512 + 8 * MIB + 3 * 512 + 3 * MIB
    assert kept.reserved_bytes == 20 * MIB + 2 * MIB  # everything fits the first large segment
    emptied = simulate_measurement(setup, body, loss=11, warmup=2, repeats=3, empty_cache=True)
    assert emptied.peak_bytes == kept.peak_bytes and emptied.reserved_bytes == kept.reserved_bytes
    # A workspace the profiling iteration allocates and keeps: not freed with the gradients; what the warm-up left.
    ws = simulate_measurement(
        setup, body, loss=11, warmup=1, repeats=1, profile=([(9, 32 * MIB)] + body, 11), persistent={9}
    )
    assert ws.baseline_bytes == kept.baseline_bytes and ws.workspace_bytes == 32 * MIB
    assert ws.peak_bytes == 3 * MIB + 512 + 32 * MIB + 8 * MIB + 512 + 3 * MIB and ws.reserved_bytes == 54 * MIB
    assert kept.workspace_bytes == 0
    big = [(20, 30 * MIB), (20, FREE)]  # a warm-up temporary in its own segment: empty_cache returns it
    assert simulate_measurement(setup, big, empty_cache=False).reserved_bytes == 52 * MIB
    assert simulate_measurement(setup, big, empty_cache=True).reserved_bytes == 52 * MIB
    # Even with no timed iteration the measured region holds the untimed one after the reset (its blocks come
    # from cudaMalloc again): the peak is an iteration's whatever the cache held ...
    assert simulate_measurement(setup, big, warmup=1, repeats=0, empty_cache=True).reserved_bytes == 52 * MIB
    # ... and empty_cache gave the warm-up's segment back before the reset: 22 MiB reserved then, not 52.
    from topk_bench.predict.simulated import SimulatedCudaSteps

    for empty, reserved in ((True, 22 * MIB), (False, 52 * MIB)):
        steps = SimulatedCudaSteps(setup, big, empty_cache=empty)
        wl = steps.build()
        steps.profile(wl)
        steps.start(wl, reset_peak=True)
        assert steps.alloc.peak_reserved == reserved


def test_a_cuda_prediction_runs_the_protocol_s_own_iterations(monkeypatch):
    """--predict --device cuda replays through iterations.run, as measure_cuda runs: one place for the protocol."""
    import dataclasses

    from topk_bench.case import Case
    from topk_bench.measure import iterations
    from topk_bench.predict import backends, simulated

    calls = []
    real_run = iterations.run

    def spy(case, steps):
        calls.append(type(steps).__name__)
        for name in ("build", "profile", "warm_up", "start", "timed", "finish"):
            method = getattr(steps, name)
            monkeypatch.setattr(steps, name, lambda *a, _m=method, _n=name, **k: (calls.append(_n), _m(*a, **k))[1])
        return real_run(case, steps)

    monkeypatch.setattr(iterations, "run", spy)
    case = Case.make(
        suite="s",
        workload="mha",
        impl="vanilla",
        params={"seq_len": 8, "d_model": 8, "heads": 2},
        device="cuda",
        method="predicted",
        warmup=2,
        repeats=3,
    )
    predicted = backends.predict(case, None)
    # The warm-up (2 iterations: the profiling one and one more), the reset, one untimed iteration, 3 timed.
    assert calls == [
        "SimulatedCudaSteps",
        "build",
        "profile",
        "warm_up",
        "start",
        "warm_up",
        "timed",
        "timed",
        "timed",
        "finish",
    ]
    # A change of the protocol's structure moves the prediction with it: one more timed iteration keeps one
    # more loss (a 512-byte block) through the timed region.
    more = backends.predict(dataclasses.replace(case, repeats=4), None)
    assert more.peak_bytes == predicted.peak_bytes + 512
    assert isinstance(simulated.SimulatedCudaSteps([], []), iterations.Steps)
