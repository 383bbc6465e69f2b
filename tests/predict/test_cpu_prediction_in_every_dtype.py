"""A CPU prediction is the CPU measurement to the byte in every dtype (issue 42): the fake run takes the path the
real one takes, whatever the CPU kind running the tests.

The fake run's outputs come from torch's meta kernels, the measured run's from its CPU kernels: where the two
size an output otherwise (``_embedding_bag``'s ``offset2bag`` for bfloat16, an index per selected entry of a
``topk_fast`` step), :mod:`topk_bench.predict.cpu_kernels` gives the prediction the CPU kernel's. The choices an
implementation makes from the machine (``half_products``, the compiled kernels) are made by the same code in both
runs; each is forced both ways here, so that a CPU kind CI lacks (AVX-512 BF16, AMX) is checked too.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from topk_bench import attention
from topk_bench.attention.kernels import native
from topk_bench.attention.shared import hardware
from topk_bench.case import Case
from topk_bench.child.execute import measure
from topk_bench.predict.cpu_kernels import CpuKernelOutputs

pytestmark = pytest.mark.usefixtures("single_thread")

DTYPES = ("float32", "bfloat16", "float16")
# A causal mha layer small enough for milliseconds, large enough that every chunked path chunks: 3 chunks of
# queries, top-8 of up to 48 keys, pages and blocks of 4.
SHAPE = {"seq_len": 48, "d_model": 32, "heads": 2, "batch": 1}
SMALL = {"chunk_size": 16, "topk": 8, "nb_features": 16, "page_size": 4, "block_size": 4, "token_budget": 16}
SMALL |= {"topk_blocks": 2, "window": 8, "sinks": 1}


def shipped() -> list[str]:
    return [s.name for s in attention.all_specs() if s.predictable and not s.name.startswith("test_")]


def _case(impl: str, dtype: str, method: str) -> Case:
    spec = attention.spec(impl)
    return Case.make(
        suite="test",
        workload="mha",
        impl=impl,
        params=SHAPE,
        options={k: v for k, v in SMALL.items() if k in spec.options},
        causal=True,
        dtype=dtype,
        method=method,
        warmup=0,
        repeats=1,
    )


def assert_predicted_is_measured(impl: str, dtype: str) -> None:
    measured = measure(_case(impl, dtype, "measured"))
    predicted = measure(_case(impl, dtype, "predicted"))
    assert (predicted.peak_bytes, predicted.baseline_bytes) == (measured.peak_bytes, measured.baseline_bytes), (
        f"{impl} {dtype}: predicted {predicted.peak_bytes:,} B (baseline {predicted.baseline_bytes:,}), "
        f"measured {measured.peak_bytes:,} B (baseline {measured.baseline_bytes:,})"
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", shipped())
def test_predicted_peak_is_the_measured_one_to_the_byte(impl, dtype):
    assert_predicted_is_measured(impl, dtype)


def _deciding(choice: str) -> list[str]:
    return [name for name in shipped() if choice in attention.spec(name).machine_choices]


@pytest.mark.parametrize("dtype", ("bfloat16", "float16"))
@pytest.mark.parametrize("native_products", [True, False], ids=["native", "float32_copies"])
@pytest.mark.parametrize("impl", _deciding("half_products"))
def test_each_half_products_decision_is_predicted_as_it_runs(impl, native_products, dtype, monkeypatch):
    # The decision of a CPU with AVX-512 BF16 / AMX (native) and of one without (float32 copies), on any CPU:
    # the real run takes it through the same function as the fake one.
    monkeypatch.setattr(hardware, "_cpu_multiplies_natively", lambda dtype: native_products)
    assert_predicted_is_measured(impl, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", _deciding("native_kernels"))
def test_the_torch_path_without_the_compiled_kernels_is_predicted_as_it_runs(impl, dtype, monkeypatch):
    monkeypatch.setattr(native, "_library", lambda: None)  # as TOPK_BENCH_NATIVE=0, or no compiler
    assert not native.built()
    assert_predicted_is_measured(impl, dtype)


def _storages(outputs) -> list[int]:
    return [t.untyped_storage().nbytes() for t in outputs]


BAGS = [
    (dtype, mode, weighted, padding_idx)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64)
    for mode, weighted in ((0, True), (0, False), (1, False), (2, False))
    for padding_idx in (-1, 2)
]


@pytest.mark.parametrize("op", ["_embedding_bag", "_embedding_bag_forward_only"])
@pytest.mark.parametrize("dtype,mode,weighted,padding_idx", BAGS)
def test_a_fake_embedding_bag_allocates_what_the_cpu_kernel_does(op, dtype, mode, weighted, padding_idx):
    # Fast path (sum, float32/float16/bfloat16, no padding_idx): no offset2bag; else one entry more than indices.
    overload = getattr(torch.ops.aten, op).default
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(10, 4, generator=g).to(dtype)
    indices, offsets = torch.randint(0, 10, (12,), generator=g), torch.arange(0, 12, 3)
    weights = torch.rand(12, generator=g).to(dtype) if weighted else None
    args = (weight, indices, offsets, False, mode, False, weights, False, padding_idx)
    real = overload(*args)
    with FakeTensorMode() as fake:
        fakes = [fake.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        with CpuKernelOutputs():
            predicted = overload(*fakes)
    assert _storages(predicted) == _storages(real)
    assert [p.shape for p in predicted] == [r.shape for r in real]
