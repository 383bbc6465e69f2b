"""What the implementations run on (topk_bench/attention/shared/hardware.py): the target device kind, which shapes
decode's
key tiles (issue 26: a CUDA step never converts the whole cache to float32, and ``--predict --device cuda``
predicts those tiles), and the float32 path of half products where a CPU emulates half GEMMs (issue 28)."""

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import topk_bench.attention
import topk_bench.attention.shared.decode as decode
from live_bytes import LiveBytes
from topk_bench.attention.shared import hardware
from topk_bench.case import Case
from topk_bench.predict.backends import predict, predict_cuda

pytestmark = pytest.mark.usefixtures("single_thread")

MIB = 1 << 20
LLAMA = {"model": "llama-3-8b", "new_tokens": 1, "batch": 1}  # 32 query heads on 8 K/V heads of 128


def test_the_target_is_the_tensors_device_unless_a_caller_names_one():
    x = torch.zeros(2)
    assert hardware.device_kind(x) == "cpu"
    with hardware.target("cuda"):
        assert hardware.device_kind(x) == "cuda"
        assert hardware.native_half_matmul(x.bfloat16())  # CUDA multiplies half matrices natively
        with hardware.target(None):
            assert hardware.device_kind(x) == "cpu"
    assert hardware.device_kind(x) == "cpu" and hardware.native_half_matmul(x)  # float32: always "native"
    with FakeTensorMode():
        assert hardware.device_kind(torch.zeros(2, device="cuda")) == "cuda"


def test_the_cpu_decision_is_its_capability(monkeypatch):
    hardware._cpu_multiplies_natively.cache_clear()
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert not hardware.native_half_matmul(torch.zeros(2, dtype=torch.bfloat16))
    hardware._cpu_multiplies_natively.cache_clear()
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    assert hardware.native_half_matmul(torch.zeros(2, dtype=torch.bfloat16))
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    hardware._cpu_multiplies_natively.cache_clear()
    assert not hardware.native_half_matmul(torch.zeros(2, dtype=torch.bfloat16))  # AVX-512 without BF16
    hardware._cpu_multiplies_natively.cache_clear()


def test_half_matmul_is_one_rounding_of_the_float32_products(monkeypatch):
    a, b = torch.randn(3, 5, 64).bfloat16(), torch.randn(3, 64, 7).bfloat16()
    monkeypatch.setattr(hardware, "native_half_matmul", lambda x: False)
    got = hardware.half_matmul(a, b)
    assert got.dtype == torch.bfloat16 and torch.equal(got, (a.float() @ b.float()).bfloat16())
    out = torch.empty(3, 5, 7, dtype=torch.bfloat16)
    assert hardware.half_matmul(a, b, out=out) is out and torch.equal(out, got)
    # a half GEMM: the same values but where a float32 ulp of the sum crosses a rounding boundary
    monkeypatch.undo()
    assert (hardware.half_matmul(a, b) == got).float().mean() > 0.99


def _float32_ranked_step(kv_len=131072):
    """Largest allocation of a float32-ranked top-k decode step over a bf16 Llama-3-8B cache (fake tensors)."""
    with FakeTensorMode():
        q = torch.randn(1, 32, 1, 128, dtype=torch.bfloat16)
        k, v = (torch.randn(1, 8, kv_len, 128, dtype=torch.bfloat16) for _ in range(2))
        with torch.no_grad(), LiveBytes(q, k, v) as tracker:
            topk_bench.attention.get("topk")(q, k, v, causal=True, topk=kv_len // 16)
    return tracker.largest


def test_a_cuda_decode_step_converts_keys_a_tile_at_a_time():
    # 131072 tokens: K in float32 is 512 MiB; the step's float32 scores are 16 MiB (32 rows x 131072).
    # (Fake CUDA tensors cannot run these ops in a CPU-only build: the target is named, as the predictor does.)
    with hardware.target("cuda"):
        cuda = _float32_ranked_step()
    assert cuda == decode.DECODE_TILE_BYTES_CUDA < 8 * 131072 * 128 * 4 / 4
    assert _float32_ranked_step() == 16 * MIB  # the CPU's 2 MiB tiles: the scores are the largest


def _decode_case(impl, device, kv_len, **options):
    return Case.make(
        suite="t",
        workload="decode",
        impl=impl,
        params={**LLAMA, "kv_len": kv_len},
        options=options,
        mode="fwd",
        causal=True,
        dtype="bfloat16",
        device=device,
        method="predicted",
    )


def test_predict_cuda_predicts_the_cuda_tiles():
    # topk ranks bf16 keys by float32 scores; at 131072 tokens a float32 copy of K would be 512 MiB.
    case = _decode_case("topk", "cuda", 131072, topk=8192)
    step = predict_cuda(case)
    working = step.peak_bytes - step.baseline_bytes
    assert working < 128 * MIB, working
    cpu = predict(_decode_case("topk", "cpu", 131072, topk=8192), None)
    assert cpu.peak_bytes - cpu.baseline_bytes < working  # a 2 MiB tile on the CPU, a 64 MiB one on CUDA


def _cache(lk, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(1, 8, 2, 64, generator=g) / 8).bfloat16()
    k, v = (torch.randn(1, 2, lk, 64, generator=g).bfloat16() for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("native", [True, False], ids=["native", "emulated"])
def test_half_ranked_decode_ranks_the_rounded_products_on_every_cpu(native, monkeypatch):
    # Emulated half GEMMs (AVX2): float32 products of converted key tiles, each rounded once into the bf16
    # scores; native: one bf16 product. Either way the step attends a top-64 of those rounded products (ties
    # in bf16 are common: any of the tied keys), with their softmax, and so does the registry's selection.
    monkeypatch.setattr(decode, "DECODE_TILE_BYTES", 32 << 10)  # 64 keys per tile: 32 tiles
    monkeypatch.setattr(decode, "native_half_matmul", lambda x: native)
    q, k, _ = _cache(2048)
    eye = torch.eye(2048, dtype=torch.bfloat16).expand(1, 2, 2048, 2048)  # the output is the weights
    spec = topk_bench.attention.spec("topk_fast")
    with torch.no_grad():
        chosen = spec.selection(q, k, causal=True, topk=64)
        weights = spec.fn(q, k, eye, causal=True, topk=64).float()
    kr = k.repeat_interleave(4, dim=1).transpose(-2, -1)
    rounded = (q @ kr if native else (q.float() @ kr.float()).bfloat16()).float()
    for picked in (chosen, weights > 0):
        assert picked.sum(-1).eq(64).all()
        worst = rounded.masked_fill(~picked, float("inf")).amin(-1)
        assert (worst >= rounded.masked_fill(picked, float("-inf")).amax(-1)).all()
    want = torch.softmax(rounded.masked_fill(weights == 0, float("-inf")), dim=-1)
    torch.testing.assert_close(weights, want, rtol=0, atol=2e-3)


def test_page_topk_decode_is_the_same_with_emulated_half_products(monkeypatch):
    q, k, v = _cache(4096, seed=3)
    fn = topk_bench.attention.get("page_topk")
    options = dict(causal=True, page_size=16, token_budget=256)
    with torch.no_grad():
        native = fn(q, k, v, **options)
        monkeypatch.setattr(topk_bench.attention.shared.block_attention, "native_half_matmul", lambda x: False)
        emulated = fn(q, k, v, **options)
        want = fn(q.float(), k.float(), v.float(), **options)
    assert emulated.dtype == torch.bfloat16
    torch.testing.assert_close(emulated.float(), native.float(), rtol=0, atol=1e-2)
    torch.testing.assert_close(emulated.float(), want, rtol=0, atol=2e-2)
    assert math.isfinite(emulated.float().abs().max().item())
