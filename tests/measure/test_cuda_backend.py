"""The CUDA backend's protocols, against a recording stand-in for ``torch.cuda`` (no GPU on this project's machines).

Checks the order each protocol needs (ours: warm-up, then peak reset, then timed runs
between events and a synchronisation; the paper's: every run timed on a fresh build,
peaks never reset) and where each number lands.
"""

import contextlib

import pytest
import torch

from topk_bench.case import Budget, Case
from topk_bench.child.execute import classify, execute
from topk_bench.child.execute import measure as run_case
from topk_bench.measure import backends as measure
from topk_bench.measure.memory import OverBudget
from topk_bench.status import STOPPING


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
        # Parameters and inputs; after the first iteration also a workspace that stays (cuBLAS's).
        return 1000 + (4096 if self.iterations else 0)

    def empty_cache(self):
        self.calls.append(("empty_cache", self.iterations))

    def reset_peak_memory_stats(self, device=None):
        self.calls.append(("reset_peak", self.iterations))

    def max_memory_allocated(self, device=None):
        self.calls.append(("read_peak", self.iterations))
        return 5000

    def max_memory_reserved(self, device=None):
        return 8192

    def Event(self, enable_timing=False):
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
    for name in (
        "is_available",
        "get_device_name",
        "current_device",
        "device",
        "synchronize",
        "memory_allocated",
        "empty_cache",
        "reset_peak_memory_stats",
        "max_memory_allocated",
        "max_memory_reserved",
        "Event",
    ):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    real_build, real_iteration = measure.build, measure.iteration

    def build_on_cpu(case, device):
        assert str(device) == "cuda:0"
        fake.calls.append(("build", fake.iterations))
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
    case = Case.make(
        suite="t",
        workload="mha",
        impl="vanilla",
        params={"seq_len": 8, "d_model": 8, "heads": 2},
        device="cuda",
        warmup=2,
        repeats=3,
    )
    m = run_case(case)
    assert m.status == "ok" and m.device_name == "Stand-in GPU"
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert fake_cuda.calls[0] == ("device", "cuda:0")
    assert ("reset_peak", 2) in fake_cuda.calls  # after both warm-up runs, before any timed one
    # The warm-up's cached segments are given back first: the reserved peak is the timed region's.
    reset = fake_cuda.calls.index(("reset_peak", 2))
    assert fake_cuda.calls[reset - 1] == ("empty_cache", 2)
    # 2 warm-up iterations, one untimed after the reset (its blocks come from cudaMalloc), 3 timed.
    assert fake_cuda.iterations == 2 + 1 + 3
    assert (m.peak_bytes, m.reserved_bytes) == (5000, 8192)
    # Baseline before the first iteration (parameters and inputs, as on the CPU); what the warm-up left is its own.
    assert m.baseline_bytes == 1000 and m.extra["workspace_bytes"] == 4096
    assert len(m.times_s) == len(m.fwd_times_s) == len(m.bwd_times_s) == 3
    # Events recorded back to back: 1 call apart = 1 "ms" x 1000 in the stand-in = 1 s.
    assert m.fwd_times_s == [1.0] * 3 and m.bwd_times_s == [1.0] * 3 and m.times_s == [2.0] * 3
    # The timed iterations run back to back: 9 events, then one synchronisation, then the peaks.
    timed = fake_cuda.calls[reset + 1 :]
    assert timed[:10] == [("record",)] * 9 + [("synchronize",)] and timed[10] == ("read_peak", 6)
    assert m.flops > 0 and m.extra["ops_per_iter"] > 0 and m.extra["timer"] == "events"


def test_a_reserved_peak_over_the_budget_keeps_its_numbers_as_over_budget(fake_cuda):
    case = Case.make(
        suite="t",
        workload="mha",
        impl="vanilla",
        params={"seq_len": 8, "d_model": 8, "heads": 2},
        device="cuda",
        warmup=1,
        repeats=2,
    )
    within = execute(case, Budget(max_memory_bytes=8192))
    assert within.status == "ok", within.error
    # Allocated 5000 fits 6000; reserved 8192 (what the process took from the device) does not.
    m = execute(case, Budget(max_memory_bytes=6000))
    assert m.status == "over_budget" and "reserved peak 8192" in m.error
    assert (m.peak_bytes, m.reserved_bytes) == (5000, 8192) and len(m.times_s) == 2


# -- the status of a failed allocation: the exception types and messages torch and CUDA libraries raise

CUDA_CASE = Case.make(suite="t", workload="mha", impl="vanilla", params={"seq_len": 8}, device="cuda")
CPU_CASE = Case.make(suite="t", workload="mha", impl="vanilla", params={"seq_len": 8}, device="cpu")
PREDICTED = Case.make(
    suite="t", workload="mha", impl="vanilla", params={"seq_len": 8}, device="cpu", method="predicted"
)
BUDGET = Budget(max_memory_bytes=30 * 2**30)  # bench.toml's default: every run has one

DEVICE_RAN_OUT = {
    "caching allocator": torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 64.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
        "78.50 GiB is free. Including non-PyTorch memory, this process has 690.00 MiB memory in use."
    ),
    "cuBLAS handle": RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    "cuBLASLt workspace": RuntimeError(
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasLtMatmul( ltHandle, computeDesc.descriptor(), ...)`"
    ),
    "cuDNN": RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
    "raw cudaMalloc": RuntimeError(
        "CUDA error: out of memory\nCUDA kernel errors might be asynchronously "
        "reported at some other API call, so the stacktrace below might be incorrect."
    ),
    "message only": RuntimeError("CUDA out of memory. Tried to allocate 2.00 MiB"),
}


@pytest.mark.parametrize("what", DEVICE_RAN_OUT)
def test_a_cuda_allocation_failure_is_oom_whatever_the_budget(what):
    exc = DEVICE_RAN_OUT[what]
    for budget in (BUDGET, Budget()):
        status, message = classify(exc, budget, CUDA_CASE)
        assert status == "oom", (what, budget)
        assert status in STOPPING  # larger sizes of the implementation are skipped
        assert message.startswith(f"{type(exc).__name__}: ") and "\n" not in message


def test_an_allocation_failure_is_over_budget_only_where_the_budget_limits_allocations():
    cpu_failure = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
        "memory: you tried to allocate 8589934592 bytes. Error code 12 (Cannot allocate memory)"
    )
    # A measured CPU case runs under an address-space limit derived from its budget.
    assert classify(cpu_failure, BUDGET, CPU_CASE)[0] == "over_budget"
    assert classify(MemoryError(), BUDGET, CPU_CASE)[0] == "over_budget"
    assert classify(cpu_failure, Budget(), CPU_CASE)[0] == "oom"
    # Predicting allocates nothing real: no limit, a failure is the machine's.
    assert classify(cpu_failure, BUDGET, PREDICTED)[0] == "oom"
    # The tracker's own budget check is over_budget on any device.
    assert classify(OverBudget(2**31, 2**30), Budget(max_memory_bytes=2**30), CUDA_CASE)[0] == "over_budget"


def test_other_cuda_library_failures_are_errors():
    for exc in (
        RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, ...)`"),
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED"),
    ):
        assert classify(exc, BUDGET, CUDA_CASE)[0] == "error", exc


def test_cuda_paper_protocol(fake_cuda):
    case = Case.make(
        suite="t",
        workload="mha",
        impl="vanilla_paper",
        params={"seq_len": 8, "d_model": 8, "heads": 2},
        causal=True,
        device="cuda",
        warmup=0,
        repeats=3,
        protocol="paper",
    )
    m = run_case(case)
    assert m.status == "ok", m.error
    calls = fake_cuda.calls
    assert not [c for c in calls if c[0] == "reset_peak"]  # peaks never reset
    # A build before each timed run (none before the first: it runs cold), the peaks read after
    # the third, then the profiling run (FLOPs) on a fourth build.
    assert [c for c in calls if c[0] in ("build", "read_peak")] == [
        ("build", 0),
        ("build", 1),
        ("build", 2),
        ("read_peak", 3),
        ("build", 3),
    ]
    assert fake_cuda.iterations == 3 + 1
    first_timed = calls.index(("record",))
    assert calls[first_timed - 1] == ("synchronize",) and calls.index(("build", 0)) < first_timed
    assert (m.peak_bytes, m.reserved_bytes, m.baseline_bytes) == (5000, 8192, 1000)
    assert m.times_s == [2.0] * 3 and m.flops > 0
