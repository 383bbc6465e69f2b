"""The GPU time model (topk_bench.predict.timing): what a kernel costs, counted from the fake run's ops; the GPU
catalogue it shares with the memory budget; the budget of a CUDA prediction; launches against ops."""

from __future__ import annotations

import json

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from topk_bench.measure.ops import OpCounter
from topk_bench.predict import kernels, timing
from topk_bench.types import DEFAULT_GPU, GpuModel

aten = torch.ops.aten
H100 = kernels.gpu("h100-sxm")


def recorded(body) -> list[timing.Kernel]:
    """The kernels ``body(make)`` launches under FakeTensorMode; ``make(*shape, dtype=)`` makes an input."""
    with FakeTensorMode() as mode:
        costs = timing.KernelCosts()

        def make(*shape, dtype=torch.float32):
            return torch.empty(*shape, dtype=dtype)

        with costs:
            body(make)
    assert mode is not None
    return costs.kernels


def test_a_matmul_is_a_gemm_of_2mnk_flops_reading_its_operands_writing_its_product():
    (k,) = recorded(lambda make: aten.mm(make(64, 128), make(128, 32)))
    assert (k.op, k.kind, k.dtype) == ("mm", timing.GEMM, "float32")
    assert k.flops == 2 * 64 * 128 * 32
    assert k.bytes == (64 * 128 + 128 * 32 + 64 * 32) * 4


def test_views_and_allocations_launch_nothing_and_ops_count_them_all():
    def body(x):
        torch.empty(4)  # an allocation: no kernel
        return x.t().unsqueeze(0) + 1  # two views, one elementwise kernel

    assert [k.kind for k in recorded(lambda make: body(make(8, 16)))] == [timing.ELEMENTWISE]
    with FakeTensorMode():
        x = torch.empty(8, 16)
        with OpCounter() as counter:
            body(x)
    assert (counter.counted.ops, counter.counted.launches) == (4, 1)


@pytest.mark.parametrize(
    "name,kind",
    [
        ("topk", timing.SELECTION),
        ("sort", timing.SELECTION),
        ("index_select", timing.INDEXING),
        ("_embedding_bag", timing.INDEXING),
        ("scatter_add_", timing.INDEXING),
        ("_scaled_dot_product_efficient_attention", timing.ATTENTION_FWD),
        ("_scaled_dot_product_flash_attention_backward", timing.ATTENTION_BWD),
        ("bmm", timing.GEMM),
        ("_softmax", timing.ELEMENTWISE),
    ],
)
def test_kernel_classes(name, kind):
    assert timing.kernel_class(name) == kind


@pytest.mark.parametrize("q,k,share", [(4, 4, 10 / 16), (1, 8, 1 / 8), (2, 1, 1.0), (3, 5, 6 / 15)])
def test_the_causal_share_counts_the_kept_scores(q, k, share):
    assert timing.causal_share(q, k) == pytest.approx(share, rel=1e-15)


def test_a_causal_fused_attention_counts_only_the_scores_it_keeps():
    def attention(causal):
        def body(make):
            q, k, v = (make(1, 2, 256, 64) for _ in range(3))
            aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal)

        (kernel,) = recorded(body)
        return kernel

    full, causal = attention(False), attention(True)
    assert full.kind == causal.kind == timing.ATTENTION_FWD
    assert full.flops == 4 * 2 * 256 * 256 * 64  # QK^T and PV, 2 FLOPs a multiply-add, 2 heads
    assert causal.flops == pytest.approx(full.flops * timing.causal_share(256, 256), rel=1e-12)
    assert causal.bytes == full.bytes


def test_a_half_gemm_is_bounded_by_the_tensor_cores_a_float32_one_by_the_cuda_cores():
    (half,) = recorded(
        lambda make: aten.mm(make(4096, 4096, dtype=torch.bfloat16), make(4096, 4096, dtype=torch.bfloat16))
    )
    (single,) = recorded(lambda make: aten.mm(make(4096, 4096), make(4096, 4096)))
    unit = timing.Constants(dict.fromkeys(timing.CLASSES, 1.0), 0.0, 0.0)
    assert timing.kernel_seconds(half, H100, unit) == pytest.approx(2 * 4096**3 / H100.tensor_half)
    assert timing.kernel_seconds(single, H100, unit) == pytest.approx(2 * 4096**3 / H100.fp32)


def test_an_elementwise_kernel_is_bounded_by_bandwidth_over_its_efficiency_plus_the_floor():
    (add,) = recorded(lambda make: make(1 << 20) + make(1 << 20))
    constants = timing.Constants(dict.fromkeys(timing.CLASSES, 0.5), 2e-6, 1e-5)
    assert add.bytes == 3 * 4 * (1 << 20)
    assert timing.kernel_seconds(add, H100, constants) == pytest.approx(2e-6 + add.bytes / H100.hbm_bytes_per_s / 0.5)


def test_eager_is_the_slower_of_host_and_device_a_graph_replay_the_device_alone():
    small = [timing.Kernel("add", timing.ELEMENTWISE, 0.0, 1024.0, "float32")] * 100
    constants = timing.Constants(dict.fromkeys(timing.CLASSES, 0.5), 2e-6, 1e-5)
    est = timing.estimate(small, H100, constants)
    assert est.launches == 100 and est.host_s == pytest.approx(1e-3)
    assert est.device_s == pytest.approx(100 * (2e-6 + 1024 / H100.hbm_bytes_per_s / 0.5))
    assert est.host_bound and est.eager_s == est.host_s
    big = [timing.Kernel("add", timing.ELEMENTWISE, 0.0, 1e10, "float32")]
    est = timing.estimate(big, H100, constants)
    assert not est.host_bound and est.eager_s == est.device_s


def test_the_fitted_constants_are_global_and_the_split_keeps_cases_apart():
    data = json.loads(timing.FITTED.read_text())
    constants = timing.Constants.fitted()
    assert set(constants.efficiency) == set(timing.CLASSES)  # one per class, none per case or method
    assert all(0 < e <= 1 for e in constants.efficiency.values())
    assert not set(data["fitted_cases"]) & set(data["held_out_cases"])
    assert data["accuracy"]["held_out"]["rows"] > 0


# -- the catalogue ---------------------------------------------------------------------------------


def test_every_part_parses_by_name_and_the_old_capabilities_are_aliases():
    assert {g.value for g in GpuModel} == {"h100-sxm", "h100-pcie", "h200", "a100-40gb", "a100-80gb", "l4", "b200"}
    assert set(kernels.GPUS) == set(GpuModel)
    assert GpuModel.parse("sm90") is GpuModel.H100_SXM is DEFAULT_GPU
    assert GpuModel.parse("sm80") is GpuModel.A100_80GB
    assert GpuModel.parse("H200") is GpuModel.H200
    with pytest.raises(ValueError, match=r"unknown GPU 'h300' \(known: h100-sxm, h100-pcie, h200, a100-40gb"):
        GpuModel.parse("h300", "GPU")


def test_the_catalogue_states_each_part_as_its_datasheet():
    h100, h200, a100 = kernels.gpu("h100-sxm"), kernels.gpu("h200"), kernels.gpu("a100-40gb")
    assert h100.memory_bytes == 80 * 10**9 and h200.memory_bytes == 141 * 10**9 and a100.memory_bytes == 40 * 10**9
    assert h100.capability == 90 and kernels.gpu("l4").capability == 89 and kernels.gpu("b200").capability == 100
    for gpu in kernels.GPUS.values():  # tensor cores beat the CUDA cores; half doubles TF32
        assert gpu.tensor_half == pytest.approx(2 * gpu.tensor_tf32, rel=0.03) and gpu.tensor_tf32 > gpu.fp32


# -- the budget of a CUDA prediction ---------------------------------------------------------------


def _resolved(tmp_path, **flags):
    from topk_bench.run.resolve import Flags, resolve
    from topk_bench.suite.load import load_suite
    from topk_bench.suite.settings import Settings

    (tmp_path / "s.toml").write_text(
        'name = "s"\nworkload = "mha"\n[shape]\nd_model = 8\nheads = 2\n[sweep]\nseq_len = [16]\n'
        '[[impl]]\nname = "vanilla"\n'
    )
    return resolve(Settings(), load_suite(tmp_path / "s.toml"), Flags(**flags))


@pytest.mark.parametrize(
    "gpu,asked,gib,note",
    [
        ("h100-sxm", None, 80e9 / 2**30, ""),
        ("h200", None, 141e9 / 2**30, ""),
        ("h100-sxm", 20.0, 20.0, ""),
        ("l4", 40.0, 24e9 / 2**30, "memory budget capped to the memory of the modelled l4, 22.4 GiB (asked 40 GiB)"),
    ],
)
def test_a_cuda_prediction_is_judged_against_the_parts_memory(tmp_path, gpu, asked, gib, note):
    run = _resolved(tmp_path, predict=True, device="cuda", gpu=gpu, max_memory_gib=asked)
    assert run.max_memory_gib == pytest.approx(gib)
    assert [n for n in run.notes if "memory budget" in n] == ([note] if note else [])


def test_a_cpu_run_keeps_bench_tomls_budget(tmp_path):
    assert _resolved(tmp_path, predict=True, device="cpu").max_memory_gib == 30.0


def test_runs_estimate_of_a_cuda_iteration_is_the_slower_of_the_time_models_device_and_host():
    from topk_bench.case import Case
    from topk_bench.run import estimate

    case = Case.make(suite="s", workload="mha", impl="vanilla", params={"seq_len": 16}, device="cuda")
    constants = timing.Constants.fitted()
    assert estimate.iteration_seconds(case, None, 1000) == pytest.approx(1000 * constants.launch_s)
