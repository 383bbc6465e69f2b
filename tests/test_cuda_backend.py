"""The CUDA backend's protocol, against a recording stand-in for ``torch.cuda`` (no GPU on this project's machines).

Checks the order the paper's method needs (warm-up, then peak reset, then timed
runs between events and a synchronisation) and where each number lands.
"""

import contextlib

import pytest
import torch

from topk_bench.measure import backends as measure
from topk_bench.case import Case


class FakeCuda:
    def __init__(self):
        self.calls = []
        self.iterations = 0

    def is_available(self):
        return True

    def get_device_name(self, device=None):
        return "Stand-in GPU"

    def current_device(self):
        return 0

    def device(self, device):
        self.calls.append(("device", str(device)))
        return contextlib.nullcontext()

    def synchronize(self, device=None):
        self.calls.append(("synchronize",))

    def memory_allocated(self, device=None):
        return 1000

    def reset_peak_memory_stats(self, device=None):
        self.calls.append(("reset_peak", self.iterations))

    def max_memory_allocated(self, device=None):
        return 5000

    def max_memory_reserved(self, device=None):
        return 8192

    def Event(self, enable_timing=False):  # noqa: N802 -- torch.cuda.Event
        assert enable_timing
        cuda = self

        class Event:
            def record(self):
                cuda.calls.append(("record",))
                self.at = len(cuda.calls)

            def elapsed_time(self, other):
                return 1000.0 * (other.at - self.at)  # milliseconds

        return Event()


@pytest.fixture
def fake_cuda(monkeypatch):
    fake = FakeCuda()
    for name in ("is_available", "get_device_name", "current_device", "device", "synchronize", "memory_allocated",
                 "reset_peak_memory_stats", "max_memory_allocated", "max_memory_reserved", "Event"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    real_build, real_iteration = measure.build, measure.iteration

    def build_on_cpu(case, device):
        assert str(device) == "cuda:0"
        return real_build(case, "cpu")

    def counted(wl, case, clock=None, losses=None):
        fake.iterations += 1
        return real_iteration(wl, case, clock, losses)

    monkeypatch.setattr(measure, "build", build_on_cpu)
    monkeypatch.setattr(measure, "iteration", counted)
    # Properties backed by global flags (monkeypatch cannot delete them): restored by hand.
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    yield fake
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_cuda_protocol(fake_cuda):
    case = Case.make(suite="t", workload="mha", impl="vanilla", params={"seq_len": 8, "d_model": 8, "heads": 2},
                     device="cuda", warmup=2, repeats=3)
    m = measure.measure(case)
    assert m.status == "ok" and m.device_name == "Stand-in GPU"
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert fake_cuda.calls[0] == ("device", "cuda:0")
    assert ("reset_peak", 2) in fake_cuda.calls  # after both warm-up runs, before any timed one
    assert fake_cuda.iterations == 2 + 3
    assert (m.peak_bytes, m.reserved_bytes, m.baseline_bytes) == (5000, 8192, 1000)
    assert len(m.times_s) == len(m.fwd_times_s) == len(m.bwd_times_s) == 3
    # Events recorded back to back: 1 call apart = 1 "ms" x 1000 in the stand-in = 1 s.
    assert m.fwd_times_s == [1.0] * 3 and m.bwd_times_s == [1.0] * 3 and m.times_s == [2.0] * 3
    timed = fake_cuda.calls[fake_cuda.calls.index(("reset_peak", 2)):]
    assert timed[1:5] == [("record",), ("record",), ("record",), ("synchronize",)]
    assert m.flops > 0
