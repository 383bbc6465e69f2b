"""The live-bytes tracker: counting rules, and agreement with the kernel's resident high-water mark."""

import collections
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from locations import ROOT
from topk_bench.measure.memory import AllocatorBytes, LiveBytes, OverBudget
from topk_bench.predict.allocator import GRANULE as CUDA_ALLOCATION_GRANULE

MIB = 1 << 20


def test_views_and_in_place_results_are_counted_once():
    tracker = LiveBytes()
    with tracker:
        x = torch.zeros(1000)  # 4000 bytes
        view = x.view(10, 100)
        x.add_(1)
        view.mul_(2)
        transposed = view.t()
        assert tracker.current_bytes == 4000
        y = x + 1
        assert tracker.current_bytes == 8000
    assert tracker.peak_bytes == 8000
    del y
    assert tracker.current_bytes == 4000
    del x, view
    assert tracker.current_bytes == 4000, "a view keeps its storage alive"
    del transposed
    assert tracker.current_bytes == 0
    assert tracker.peak_bytes == 8000


def test_storage_is_subtracted_when_freed_not_when_a_tensor_dies():
    tracker = LiveBytes()
    with tracker:
        for _ in range(5):
            t = torch.ones(MIB)  # 4 MiB, the previous one freed on rebinding
            del t
        a = torch.ones(MIB)
        b = a.view(-1)
        del a
        assert tracker.current_bytes == 4 * MIB
        del b
    assert tracker.current_bytes == 0
    assert tracker.peak_bytes == 4 * MIB


def test_baseline_counts_registered_parameters_and_inputs_once():
    model = torch.nn.Linear(16, 8)
    x = torch.randn(4, 16)
    tracker = LiveBytes()
    tracker.register(model, [x, x.view(-1)], model.weight)  # repeats and views: no double count
    expected = (16 * 8 + 8 + 4 * 16) * 4
    assert tracker.baseline_bytes == tracker.current_bytes == tracker.peak_bytes == expected
    with tracker:
        model(x).sum()
    assert tracker.peak_bytes == expected + 4 * 8 * 4 + 4  # linear output, then its sum (scalar)


def test_backward_allocations_are_seen_and_grads_stay_live():
    w = torch.randn(256, 256, requires_grad=True)
    x = torch.randn(64, 256)
    tracker = LiveBytes()
    tracker.register(w, x)
    with tracker:
        (x @ w).relu().mean().backward()
    assert w.grad is not None
    grad_bytes = w.grad.untyped_storage().nbytes()
    # Still live after backward: w.grad only (the graph and its saved tensors are gone).
    assert tracker.current_bytes == tracker.baseline_bytes + grad_bytes
    assert tracker.peak_bytes >= tracker.baseline_bytes + grad_bytes + 64 * 256 * 4


def test_out_variant_resizing_its_output_is_counted():
    a, b = torch.ones(1000), torch.ones(1000)
    out = torch.empty(0)
    tracker = LiveBytes()
    tracker.register(a, b, out)
    with tracker:
        torch.add(a, b, out=out)
    assert tracker.current_bytes == 3 * 4000


def test_sparse_tensors_count_their_indices_and_values():
    tracker = LiveBytes()
    with tracker:
        dense = torch.eye(64)
        sparse = dense.to_sparse()
    assert tracker.current_bytes == 64 * 64 * 4 + 2 * 64 * 8 + 64 * 4
    del sparse
    assert tracker.current_bytes == 64 * 64 * 4


def test_rounding_to_the_cuda_granule():
    tracker = LiveBytes(round_to=CUDA_ALLOCATION_GRANULE)
    with tracker:
        small = torch.ones(1)
        big = torch.ones(1000)  # 4000 bytes -> 4096
    assert tracker.current_bytes == 512 + 4096
    del small, big


def test_allocator_bytes_follow_the_allocators_own_reports_and_agree_with_live_bytes():
    # What a compiled call is measured by: every allocation and free of the region, in order.
    mib = 1 << 20
    kept = torch.ones(1000)

    def region():
        a = torch.empty(mib, dtype=torch.uint8)
        b = torch.empty(2 * mib, dtype=torch.uint8)
        del a
        c = torch.empty(mib, dtype=torch.uint8)
        d = torch.empty(mib, dtype=torch.uint8)
        m = torch.ones(128, 512)
        p = torch.matmul(m, m.t())  # aten::matmul holds the aten::mm that allocates: counted once, not per level
        del b, c, d, m, p  # live were b, c, d, m and p: 4.25 MiB, the peak
        e = torch.empty(3 * mib, dtype=torch.uint8)
        return e

    peaks = []
    for tracker in (AllocatorBytes(), LiveBytes()):
        tracker.register(kept)
        with tracker:
            region()
        peaks.append((tracker.baseline_bytes, tracker.peak_bytes))
    assert peaks[0] == peaks[1] == (4000, 4000 + 4 * mib + 128 * 512 * 4 + 128 * 128 * 4)


def test_limit_raises_from_the_op_that_crosses_it():
    tracker = LiveBytes(limit=MIB)
    with pytest.raises(OverBudget) as info:
        with tracker:
            torch.ones(1024)
            torch.ones(MIB)
    assert info.value.live_bytes > info.value.limit == MIB


def test_fake_tensor_mode_sizes_without_allocating():
    fake = FakeTensorMode()
    tracker = LiveBytes()
    with fake, tracker:
        x = torch.empty(1 << 40, dtype=torch.uint8)  # 1 TiB, nothing allocated
        y = x[: 1 << 39]
        assert tracker.current_bytes == 1 << 40
        z = y.float()
        assert tracker.current_bytes == (1 << 40) + (1 << 41)
        del z
    assert tracker.peak_bytes == (1 << 40) + (1 << 41)
    assert tracker.current_bytes == 1 << 40
    del x, y


class _Seen(TorchDispatchMode):
    """Counts the ops that reach it."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func] += 1
        return func(*args, **(kwargs or {}))


def _attention_like(tracker, fake=None):
    seen = _Seen()
    with contextlib.ExitStack() as stack:
        if fake is not None:
            stack.enter_context(fake)
        stack.enter_context(seen)
        stack.enter_context(tracker)
        q, k = torch.randn(2, 3, 16, 8), torch.randn(2, 3, 16, 8)
        out = (q @ k.transpose(-2, -1)).softmax(-1) @ k
        assert out.device == torch.device("cpu")
        del out
    return seen.ops


def test_device_queries_of_fake_tensors_stop_at_the_tracker():
    # C++ asks fake tensors their device through the Python modes, a dozen times per matmul:
    # the tracker answers (as FakeTensorMode would), so the modes below never see the query.
    fake_tracker, real_tracker = LiveBytes(), LiveBytes()
    below = _attention_like(fake_tracker, FakeTensorMode())
    assert below[torch.ops.prim.device.default] == 0 and below[torch.ops.aten.bmm.default] == 2
    _attention_like(real_tracker)
    assert fake_tracker.peak_bytes == real_tracker.peak_bytes > 0


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc/self/clear_refs")
def test_tracker_peak_agrees_with_resident_high_water_mark():
    """Each implementation in a fresh process whose glibc returns every freed block to the kernel.

    Compared: bytes above the inputs, tracker vs ``VmHWM - VmRSS`` of the measured
    iteration (B=1, H=12, L=2048, d=64, causal, fwd+bwd). The three probes run at once.
    """
    import topk_bench.attention

    impls = ["vanilla", "qchunk", "topk"]
    missing = [name for name in impls if name not in topk_bench.attention.names()]
    assert not missing, f"implementations not registered: {missing}"
    env = {
        **os.environ,
        "MALLOC_MMAP_THRESHOLD_": "65536",
        "MALLOC_TRIM_THRESHOLD_": "0",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),
    }
    probes = {
        name: subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "helpers" / "rss_probe.py"), name, "2048"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in impls
    }
    for name, proc in probes.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-2000:]
        seen = json.loads(out)
        assert seen["tracker_bytes"] > 150 * MIB  # the measured iteration did allocate
        assert seen["rss_bytes"] == pytest.approx(seen["tracker_bytes"], rel=0.02), name
