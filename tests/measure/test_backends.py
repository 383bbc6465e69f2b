"""Backends in-process: the CPU measurement, the prediction that must equal it, the result's shape."""

import time
from pathlib import Path

import pytest
import torch

from locations import TESTS
from topk_bench import attention, workloads
from topk_bench.case import Budget, Case
from topk_bench.child.execute import execute, measure

GIB = 1 << 30
TINY = {
    "mha": {"seq_len": 48, "d_model": 32, "heads": 2},
    "ff": {"seq_len": 24, "batch": 2, "d_model": 32, "d_ff": 64},
    "decoder": {"seq_len": 48, "d_model": 32, "heads": 2, "d_ff": 64, "layers": 2},
}
# Small enough that the chunked implementations really chunk (3 query chunks, top-8 of 48 keys).
SMALL_OPTIONS = {"chunk_size": 16, "topk": 8, "nb_features": 16}


def options_for(name: str) -> dict:
    return {k: v for k, v in SMALL_OPTIONS.items() if k in attention.spec(name).options}


def predictable(activation: str) -> list[str]:
    return [
        s.name
        for s in attention.all_specs()
        if s.predictable and activation in s.activations and not s.name.startswith("test_")
    ]


def tiny_case(workload: str, impl: str, **fields) -> Case:
    extra = {}
    if workload == "decoder":
        ff = impl if "relu" in attention.spec(impl).activations else "vanilla"
        extra = {"ff_impl": ff, "ff_options": options_for(ff)}
    fields = {"causal": workload == "mha", "warmup": 0, "repeats": 1, **fields}
    return Case.make(
        suite="test", workload=workload, impl=impl, params=TINY[workload], options=options_for(impl), **extra, **fields
    )


pytestmark = pytest.mark.usefixtures("single_thread")


CASES = [(w, i) for w in ("mha", "decoder") for i in predictable("softmax")] + [("ff", i) for i in predictable("relu")]


@pytest.mark.parametrize("workload,impl", CASES, ids=[f"{w}-{i}" for w, i in CASES])
def test_predicted_peak_equals_measured_cpu_peak(workload, impl):
    measured = execute(tiny_case(workload, impl))
    predicted = execute(tiny_case(workload, impl, method="predicted"))
    assert measured.status == predicted.status == "ok", (measured.error, predicted.error)
    assert predicted.peak_bytes == pytest.approx(measured.peak_bytes, rel=0.005)
    assert predicted.baseline_bytes == measured.baseline_bytes
    assert predicted.flops == measured.flops
    assert predicted.times_s == []


def test_cpu_result_shape_and_timings():
    case = tiny_case("mha", "vanilla", repeats=3, warmup=1)
    m = measure(case)
    assert m.status == "ok" and m.error == ""
    assert len(m.times_s) == len(m.fwd_times_s) == len(m.bwd_times_s) == 3
    assert all(t == pytest.approx(f + b) for t, f, b in zip(m.times_s, m.fwd_times_s, m.bwd_times_s))
    assert all(t > 0 for t in m.fwd_times_s + m.bwd_times_s)
    assert m.time_median_s is not None and m.time_iqr_s >= 0
    assert {"torch_version", "cuda_version", "threads", "hostname", "git_sha"} <= set(m.metadata)
    assert m.device_name and m.device_name == m.metadata["device_name"]
    # Baseline: the layer's parameters (4 projections with biases) and its input, float32.
    p = TINY["mha"]
    params = 4 * (p["d_model"] * p["d_model"] + p["d_model"])
    assert m.baseline_bytes == 4 * (params + p["seq_len"] * p["d_model"])
    assert m.peak_bytes > m.baseline_bytes


def test_forward_only_keeps_nothing_for_backward():
    both = measure(tiny_case("mha", "vanilla"))
    fwd = measure(tiny_case("mha", "vanilla", mode="fwd"))
    assert fwd.bwd_times_s == [] and len(fwd.times_s) == 1
    assert fwd.baseline_bytes == both.baseline_bytes
    assert fwd.peak_bytes < both.peak_bytes
    assert fwd.flops * 3 == both.flops  # backward of a matmul: two matmuls of the same size


def test_float64_doubles_every_byte():
    f32 = execute(tiny_case("mha", "vanilla", method="predicted"))
    f64 = execute(tiny_case("mha", "vanilla", method="predicted", dtype="float64"))
    mask = TINY["mha"]["seq_len"] ** 2  # the boolean causal mask does not grow
    assert f64.peak_bytes - mask == 2 * (f32.peak_bytes - mask)


def test_predicting_a_cuda_case_goes_through_the_caching_allocator():
    cpu = execute(tiny_case("mha", "vanilla", method="predicted"))
    cuda = execute(tiny_case("mha", "vanilla", method="predicted", device="cuda"))
    assert cuda.status == "ok"
    # Every tiny storage is a 512-byte block of one 2 MiB small-pool segment, with cuBLASLt's 1 MiB workspace;
    # the two threads' cuBLAS workspaces (sm90: 32 MiB) have a segment each.
    assert cuda.peak_bytes > cpu.peak_bytes and cuda.peak_bytes % 512 == 0
    assert cuda.extra["workspace_bytes"] == 65 << 20
    assert cuda.reserved_bytes == (2 + 32 + 32) << 20 and cpu.reserved_bytes is None
    assert cuda.baseline_bytes % 512 == 0 and cuda.flops == cpu.flops


def test_same_seed_same_workload():
    case = tiny_case("ff", "vanilla")
    a, b = workloads.build(case, "cpu", torch.float32), workloads.build(case, "cpu", torch.float32)
    assert all(x.equal(y) for x, y in zip(a.model.parameters(), b.model.parameters()))
    assert a.inputs[0].equal(b.inputs[0])


def test_an_unknown_workload_is_an_error_row():
    assert {"mha", "ff", "decoder", "pretrained"} <= set(workloads.names())
    m = execute(Case.make(suite="t", workload="nope", impl="vanilla", params={"seq_len": 8}))
    assert m.status == "error" and "unknown workload 'nope'" in m.error


def test_bad_parameters_and_options_are_errors_not_exceptions():
    m = execute(Case.make(suite="t", workload="mha", impl="vanilla", params={"seq_len": 8, "widht": 3}))
    assert m.status == "error" and "'widht'" in m.error
    m = execute(Case.make(suite="t", workload="mha", impl="vanilla", params={"seq_len": 8}, options={"topk": 3}))
    assert m.status == "error" and "'topk'" in m.error
    m = execute(Case.make(suite="t", workload="mha", impl="nonexistent", params={"seq_len": 8}))
    assert m.status == "error" and "nonexistent" in m.error


def test_unsupported_combinations():
    m = execute(Case.make(suite="t", workload="ff", impl="sdpa", params=TINY["ff"]))
    assert m.status == "unsupported" and "relu" in m.error


def test_measured_peak_over_budget():
    case = tiny_case("mha", "vanilla")
    m = execute(case, Budget(max_memory_bytes=execute(case).peak_bytes - 1))
    assert m.status == "over_budget" and m.peak_bytes is not None


def _hwm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise KeyError("VmHWM")


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_bert_base_vanilla_at_65k_predicts_hundreds_of_gib_without_allocating():
    case = Case.make(
        suite="t", workload="mha", impl="vanilla", params={"seq_len": 65536}, causal=True, method="predicted"
    )
    Path("/proc/self/clear_refs").write_text("5")
    before = _hwm_bytes()
    start = time.perf_counter()
    m = execute(case)
    elapsed = time.perf_counter() - start
    assert m.status == "ok", m.error
    # Scores, softmax and their gradients: 12 x 65536^2 floats = 192 GiB each, several at once.
    assert 400 * GIB < m.peak_bytes < 1000 * GIB
    assert m.flops > 10**13
    assert _hwm_bytes() - before < 256 << 20
    assert elapsed < 60


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_predictable_plug_in_that_reads_a_value_gets_a_row_naming_the_flag(device):
    """A plug-in registered predictable (the default) that calls ``.item()``: --predict cannot size it, and the
    row's error says which declaration to change, not only torch's DataDependentOutputException."""
    from topk_bench.doctor import tiny
    from topk_bench.plugins import load
    from topk_bench.types import Method

    plugin = str(TESTS / "plugins" / "item_attention.py")
    load([plugin])
    result = execute(tiny.case("test_item", device=device, method=Method.PREDICTED, plugins=(plugin,)))
    assert result.status == "error"
    assert result.error.startswith("NotPredictable: test_item is registered with predictable=True")
    assert "DataDependentOutputException" in result.error and "predictable=False" in result.error
