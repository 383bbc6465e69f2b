"""The CUDA kernel allocation rules (topk_bench.predict.kernels), each against a hand count from its CUDA source.

Every test runs ops on fake CPU tensors through :class:`KernelTrace` (what ``--predict --device cuda`` does) and
compares the allocations, in order, with the bytes written out from the kernel's source for a small shape:
``+n`` an allocation of n bytes, ``-n`` its free. The CPU trace of the same ops is there where the point is that
CUDA allocates otherwise.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from topk_bench.predict import kernels
from topk_bench.predict.kernels import registry
from topk_bench.predict.kernels.accumulation import EngineAdds
from topk_bench.predict.kernels.program import Call, Free, Temp
from topk_bench.predict.kernels.rules import attention, cub, selection
from topk_bench.predict.kernels.sdpa_select import Backend
from topk_bench.predict.trace import AllocationTrace

MIB = 1 << 20
FREE = AllocationTrace.FREE


def signed(events) -> list[int]:
    """Events as +bytes (allocated) and -bytes (freed); allocations of 0 bytes (CUDA keeps the tensor off the
    device, or it is empty) are left out."""
    sizes, out = {}, []
    for serial, nbytes in events:
        if nbytes == FREE:
            if sizes[serial]:
                out.append(-sizes[serial])
        else:
            sizes[serial] = nbytes
            if nbytes:
                out.append(nbytes)
    return out


def traced(make, body, gpu="sm90", cuda=True):
    """The events of ``body(*make())`` on CUDA's path (``cuda=False``: the CPU kernels' plain trace), the inputs
    made before (their events dropped) and the outputs kept alive past it; also the trace and the composites."""
    g, adds = kernels.gpu(gpu), EngineAdds()
    fake = FakeTensorMode()
    trace = kernels.KernelTrace(g, adds) if cuda else AllocationTrace()
    composites = kernels.CudaComposites(g, adds) if cuda else contextlib.nullcontext()
    with fake, composites, trace:
        inputs = make()
        trace.take()
        kept = body(*inputs)
        events = trace.take()
    del kept
    return events, trace, composites


def steps_of(op, *args, gpu="sm90", **kwargs):
    """The program ``op``'s rule returns for one call on fake tensors (args built by the callables given)."""
    with FakeTensorMode():
        real = [a() if callable(a) else a for a in args]
        out = op(*real, **kwargs)
        return registry.lookup(op).steps(Call(op, tuple(real), kwargs, out, kernels.gpu(gpu)))


# -- softmax (SoftMax.cu) -------------------------------------------------------------------------------


def test_softmax_backward_allocates_grad_times_output_and_log_softmax_backward_does_not():
    """softmax_backward_cuda_out: ``tmp = grad * output`` ([4, 256] float: 4096 B) after grad_input, freed on
    return; log_softmax_backward_cuda_out has no product. The CPU kernel allocates neither."""
    make = lambda: (torch.randn(4, 256), torch.randn(4, 256))  # noqa: E731
    softmax = lambda g, y: torch.ops.aten._softmax_backward_data(g, y, -1, torch.float32)  # noqa: E731
    log_softmax = lambda g, y: torch.ops.aten._log_softmax_backward_data(g, y, -1, torch.float32)  # noqa: E731
    assert signed(traced(make, softmax)[0]) == [4096, 4096, -4096]
    assert signed(traced(make, softmax, cuda=False)[0]) == [4096]
    assert signed(traced(make, log_softmax)[0]) == [4096]
    # a strided output: host_softmax_backward's output.contiguous() copies it too (4096 B)
    strided = lambda: (torch.randn(4, 256), torch.randn(256, 4).t())  # noqa: E731
    assert signed(traced(strided, softmax)[0]) == [4096, 4096, 4096, 4096, -4096, -4096, -4096]


def test_softmax_forward_copies_a_strided_input_only():
    contiguous = lambda: (torch.randn(8, 128),)  # noqa: E731
    strided = lambda: (torch.randn(128, 8).t(),)  # noqa: E731
    forward = lambda x: torch.ops.aten._softmax(x, -1, False)  # noqa: E731
    assert signed(traced(contiguous, forward)[0]) == [4096]
    assert signed(traced(strided, forward)[0]) == [4096, 4096, -4096]  # host_softmax's input.contiguous()


# -- top-k and sort (TensorTopK.cu, Sort.cu, cub) ------------------------------------------------------------


def test_multiblock_topk_buffers_by_hand():
    """[5000, 400] float, k = 10, sm90 (132 SMs; 65536 registers / (40 x 256) = 6 blocks per SM):
    should_use_multiblock (more than 4000 slices of 400 or more); items per thread
    ceil(2,000,000 / (132 x 6 x 256)) = 10, so ceil(400 / 2560) = 1 block per slice, 5000 blocks.
    mbtopk::launch: kthValues 5000 x 4, ks_to_find 2 x 5000 x 4, desired 2 x 5000 x 4, counts 5000 x 256 x 2 (short),
    digit_cum_sum 5000 x 256 x 4, withinKCounts and kthCounts 5000 x 4; then two cub scans by key of 5000 items:
    5 tiles of 1024, (5 + 32) x 16 B of tile states -> 768, (5 + 1) x 4 B of keys -> 256, + 255 = 1279 B each."""
    buffers = [20_000, 40_000, 40_000, 2_560_000, 5_120_000, 20_000, 20_000]
    expected = [200_000, 400_000] + buffers + [1279, -1279, 1279, -1279] + [-b for b in reversed(buffers)]
    make = lambda: (torch.randn(5000, 400),)  # noqa: E731
    assert signed(traced(make, lambda x: x.topk(10, dim=-1, sorted=False))[0]) == expected
    assert selection.items_per_thread(kernels.gpu("sm90"), 5000, 400) == 10


def test_multiblock_topk_blocks_follow_the_sm_count():
    """[100, 10000], k = 8: sm90 has ceil(10^6 / 202,752) = 5 items a thread, ceil(10000 / 1280) = 8 blocks a
    slice; sm80 (108 SMs) ceil(10^6 / 165,888) = 7, ceil(10000 / 1792) = 6: counts 800 or 600 x 256 x 2 B."""
    counts = {}
    for gpu in ("sm90", "sm80"):
        steps = steps_of(torch.ops.aten.topk.default, lambda: torch.randn(100, 10000), 8, -1, True, False, gpu=gpu)
        counts[gpu] = next(s.nbytes for s in steps if isinstance(s, Temp) and s.name == "counts")
    assert counts == {"sm90": 800 * 256 * 2, "sm80": 600 * 256 * 2}


def test_single_block_topk_allocates_nothing_but_its_outputs():
    """[16, 1000]: 16 slices of fewer than 20000 -> sbtopk, which takes no buffer."""
    events = traced(lambda: (torch.randn(16, 1000),), lambda x: x.topk(10))[0]
    assert signed(events) == [16 * 10 * 4, 16 * 10 * 8]


def test_sort_of_a_million_keys_by_hand():
    """1-D, 10^6 int32: one segment -> segmented_sort_large_segments: int64 indices (8,000,000 B), then cub's
    SortPairs (int32 keys, int64 values): onesweep tiles of 384 x 10 (21 items of 4 B scaled to 8 B values),
    261 blocks, 4 passes; bins 1 x 4 x 256 x 4 = 4096, lookback 261 x 256 x 4 = 267,264, the third keys 4,000,000
    and values 8,000,000, counters 4 x 4 -> 256, + 255 = 12,271,871 B."""
    assert cub.radix_sort_bytes(1_000_000, 4, 8) == 12_271_871
    events = traced(lambda: (torch.randint(0, 9, (1_000_000,), dtype=torch.int32),), lambda x: x.sort())[0]
    assert signed(events) == [4_000_000, 8_000_000, 8_000_000, 12_271_871, -12_271_871, -8_000_000]


def test_a_short_sort_fills_its_indices_in_place():
    """Up to 4096 along the dim: fillSliceWithIndex's arange (4096 x 8 B), then the in-place bitonic sort."""
    events = traced(lambda: (torch.randn(8, 4096),), lambda x: x.sort(dim=-1))[0]
    assert signed(events) == [8 * 4096 * 4, 8 * 4096 * 8, 4096 * 8, -4096 * 8]


# -- SDPA: the backend, and its kernels' buffers (attention.cu, attention_backward.cu, flash_api.cpp) ----------


def _qkv(dtype, b=1, h=2, lq=128, lk=128, d=64, hk=None, grad=True):
    """q, k, v as attention layers make them: [B, L, H, D] tensors seen as [B, H, L, D]."""
    return tuple(
        torch.randn(b, length, n, d, dtype=dtype, requires_grad=grad).transpose(1, 2)
        for n, length in ((h, lq), (hk or h, lk), (hk or h, lk))
    )


@pytest.mark.parametrize(
    "dtype,gpu,mask,backend",
    [
        (torch.bfloat16, "sm90", False, Backend.CUDNN),  # cuDNN first on sm90 with cuDNN 9.15.1+
        (torch.bfloat16, "sm80", False, Backend.FLASH),
        (torch.bfloat16, "sm80", True, Backend.EFFICIENT),  # flash takes no mask
        (torch.float32, "sm90", False, Backend.EFFICIENT),  # flash and cuDNN need half
        (torch.float32, "sm80", True, Backend.EFFICIENT),
    ],
)
def test_sdpa_runs_the_backend_cuda_selects(dtype, gpu, mask, backend):
    def body(q, k, v):
        bias = torch.zeros(128, 128, dtype=dtype) if mask else None
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    assert traced(lambda: _qkv(dtype), body, gpu=gpu)[2].backends == [backend]


def test_sdpa_falls_back_to_math_for_a_head_dim_no_fused_kernel_takes():
    """float32, head dim 6: not a multiple of efficient attention's 4-element alignment."""
    assert traced(lambda: _qkv(torch.float32, d=6), F.scaled_dot_product_attention)[2].backends == [Backend.MATH]


def test_efficient_attention_forward_pads_the_logsumexp_to_32_queries():
    """float32 [1, 2, 100, 64]: output 1 x 100 x 2 x 64 x 4 = 51,200 B, logsumexp [1, 2, ceil(100/32) x 32] float
    = 1024 B (the CPU math path keeps [1, 2, 100, 100] attention weights instead)."""
    events = traced(lambda: _qkv(torch.float32, lq=100, lk=100), F.scaled_dot_product_attention)[0]
    assert signed(events) == [51_200, 1024]


def test_efficient_attention_backward_by_hand():
    """float32, B = 1, H = 2, M = N = 128, D = 64, sm90: the gradients (3 x 65,536 B); delta on the host,
    ``(grad_out * out).sum(-1).transpose(-2, -1).contiguous()``: the product 65,536, the sum 1024 and the copy
    1024 B; the kernel of the CUTLASS table (BI = BJ = 64, kMaxK 64, no output accumulators for float) and its
    workspace: dQ accumulators of ceil(128/64) x ceil(64/64) tiles of (16 + 4 x 64 x 64) B per batch and head:
    2 x 8200 floats = 65,600 B."""

    def body(q, k, v):
        out = F.scaled_dot_product_attention(q, k, v)
        out.backward(torch.ones_like(out))
        return out

    events = signed(traced(lambda: _qkv(torch.float32), body)[0])
    # forward: output, logsumexp; backward: the gradient of ones, the three gradients, delta, the workspace
    assert events[:14] == [
        65_536,
        1024,
        65_536,
        65_536,
        65_536,
        65_536,
        65_536,
        1024,
        1024,
        -1024,
        -65_536,
        65_600,
        -1024,
        -65_600,
    ]
    assert (
        attention.efficient_workspace(torch.empty(1, 2, 128, 64), torch.empty(1, 2, 128, 64), 128, False, 90) == 65_600
    )


def test_flash_forward_splits_the_keys_of_a_decode_step():
    """bf16, q [1, 8, 1, 64], K/V [1, 8, 4096, 64], no dropout, sm90: 8 x ceil(1/64) = 8 blocks of queries, far
    under 80% of 264 SMs x 2; 16 blocks of 256 keys; num_splits_heuristic picks 16 splits (efficiency 0.48, the
    best): softmax_lse_accum [16, 1, 8, 1] float = 512 B and out_accum [16, 1, 8, 1, 64] float = 32,768 B."""
    assert attention.num_splits_heuristic(8, 264, 16, 128) == 16
    steps = steps_of(
        torch.ops.aten._scaled_dot_product_flash_attention.default,
        lambda: torch.randn(1, 8, 1, 64, dtype=torch.bfloat16),
        lambda: torch.randn(1, 8, 4096, 64, dtype=torch.bfloat16),
        lambda: torch.randn(1, 8, 4096, 64, dtype=torch.bfloat16),
    )
    assert [(s.name, s.nbytes) for s in steps if isinstance(s, Temp)] == [
        ("softmax_lse_accum", 512),
        ("out_accum", 32_768),
    ]


def test_flash_backward_accumulates_dq_in_float_and_expands_grouped_heads():
    """bf16 q [1, 4, 100, 64], K/V with 2 heads of 100 keys: softmax_d [1, 4, 128] float = 2048 B, dq_accum
    [1, 128, 4, 64] float = 131,072 B, dk/dv_expanded [1, 100, 4, 64] bf16 = 51,200 B each."""
    q = lambda: torch.randn(1, 100, 4, 64, dtype=torch.bfloat16).transpose(1, 2)  # noqa: E731
    kv = lambda: torch.randn(1, 100, 2, 64, dtype=torch.bfloat16).transpose(1, 2)  # noqa: E731
    with FakeTensorMode():
        args = (
            q(),
            q(),
            kv(),
            kv(),
            q(),
            torch.randn(1, 4, 100),
            None,
            None,
            100,
            100,
            0.0,
            False,
            torch.zeros(2, dtype=torch.int64),
            torch.zeros((), dtype=torch.int64),
        )
        out = (q(), kv(), kv())
        op = torch.ops.aten._scaled_dot_product_flash_attention_backward.default
        steps = registry.lookup(op).steps(Call(op, args, {}, out, kernels.gpu("sm90")))
    assert [(s.name, s.nbytes) for s in steps if isinstance(s, Temp)] == [
        ("softmax_d", 2048),
        ("dq_accum", 131_072),
        ("dk_expanded", 51_200),
        ("dv_expanded", 51_200),
    ]


# -- BLAS (Blas.cpp, CublasHandlePool.cpp) ---------------------------------------------------------------------


def test_the_cublas_workspace_comes_with_the_first_gemm_of_each_thread_and_cublaslt_with_a_bias():
    """sm90: 32 MiB (``:4096:8``) at the first GEMM of the forward thread, after its output; a second GEMM takes
    none; addmm with a 1-D bias takes the cuBLASLt path and its 1 MiB; the backward (the engine's thread, its own
    handle) 32 MiB more at its first GEMM. sm80: ``:4096:2:16:8`` = 8,519,680 B."""

    def body(x, w, b):
        y = F.linear(x, w, b)  # addmm: output 1024 B, cuBLAS 32 MiB, cuBLASLt 1 MiB
        z = y @ w  # mm: output only
        z.sum().backward()
        return y, z

    def make():
        return torch.randn(16, 16), torch.randn(16, 16, requires_grad=True), torch.randn(16, requires_grad=True)

    events, trace, _ = traced(make, body)
    sizes = signed(events)
    assert sizes[:4] == [1024, 32 * MIB, 1 * MIB, 1024]
    assert sizes.count(32 * MIB) == 2 and sizes.count(1 * MIB) == 1 and -32 * MIB not in sizes
    assert sorted(trace.workspaces) == [("cuBLAS", "backward"), ("cuBLAS", "forward"), ("cuBLASLt", "forward")]
    assert trace.persistent == frozenset(trace.workspaces.values())
    sm80 = signed(traced(make, body, gpu="sm80")[0])
    assert sm80.count(4096 * 1024 * 2 + 16 * 1024 * 8) == 2


def test_a_gemm_operand_in_no_blas_layout_is_copied():
    """prepare_matrix_for_cublas: a [32, 32] view with strides (64, 2) is neither row- nor column-major: a
    contiguous copy (4096 B) for the call."""
    make = lambda: (torch.randn(32, 64)[:, ::2], torch.randn(32, 32))  # noqa: E731
    sizes = signed(traced(make, lambda a, b: a @ b)[0])
    assert sizes == [4096, 4096, 32 * MIB, -4096]


# -- layer norm, embedding bag, dropout -------------------------------------------------------------------------


def test_layer_norm_backward_partial_sums_for_many_short_rows():
    """M = 70,000 rows of N = 64 on sm90: M > 65,536 and 64 / 32 < 132 / 2: the two-stage gamma/beta reduction,
    blocks.y = min(32,768 / ceil(64/32), ceil(70,000/32)) = 2188, two partial buffers of 2188 x 64 floats."""
    steps = steps_of(
        torch.ops.aten.native_layer_norm_backward.default,
        lambda: torch.randn(70_000, 64),
        lambda: torch.randn(70_000, 64),
        [64],
        lambda: torch.randn(70_000, 1),
        lambda: torch.randn(70_000, 1),
        lambda: torch.randn(64),
        lambda: torch.randn(64),
        [True, True, True],
    )
    assert [(s.name, s.nbytes) for s in steps] == [("dgamma_blocks", 560_128), ("dbeta_blocks", 560_128)]
    few = steps_of(
        torch.ops.aten.native_layer_norm_backward.default,
        lambda: torch.randn(1000, 64),
        lambda: torch.randn(1000, 64),
        [64],
        lambda: torch.randn(1000, 1),
        lambda: torch.randn(1000, 1),
        lambda: torch.randn(64),
        lambda: torch.randn(64),
        [True, True, True],
    )
    assert few == []


def test_embedding_bag_outputs_are_sized_as_cuda_sizes_them():
    """_embedding_bag_cuda, weight [10, 4] float, 6 int64 indices in 3 bags, mode sum: bag_size 3 x 8, offset2bag
    6 x 8, output 3 x 4 x 4, max_indices empty; int32 offsets are first promoted to int64 (3 x 8 B, freed)."""

    def bag(offsets_dtype):
        return lambda: (
            torch.randn(10, 4),
            torch.tensor([0, 2, 4, 5, 1, 3]),
            torch.tensor([0, 2, 4], dtype=offsets_dtype),
        )

    body = lambda w, i, o: torch.ops.aten._embedding_bag(w, i, o, False, 0)  # noqa: E731
    assert signed(traced(bag(torch.int64), body)[0]) == [24, 48, 48]
    assert signed(traced(bag(torch.int32), body)[0]) == [24, 24, 48, 48, -24]


def test_dropout_is_cudas_fused_kernel_with_a_boolean_mask():
    """Dropout.cpp is_fused_kernel_acceptable: on CUDA native_dropout, an output and a bool mask (1024 B for 1024
    elements), where the CPU branch draws float noise (4096 B) and multiplies."""
    make = lambda: (torch.randn(4, 256),)  # noqa: E731
    assert signed(traced(make, lambda x: F.dropout(x, 0.1))[0]) == [4096, 1024, -1024]  # no grad: mask not kept
    assert 1024 not in signed(traced(make, lambda x: F.dropout(x, 0.1), cuda=False)[0])


def test_a_functions_backward_takes_cudas_branch_too():
    """A custom Function recomputing a dropout in its backward (the paper's query chunks): native_dropout there."""

    class Recompute(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return F.dropout(grad, 0.1)

    def body(x):
        Recompute.apply(x).sum().backward()
        return x.grad

    sizes = signed(traced(lambda: (torch.randn(4, 256, requires_grad=True),), body)[0])
    assert 1024 in sizes  # the boolean mask of native_dropout (the CPU branch would draw 4096 B of noise)


# -- the autograd engine, and what is not modelled -------------------------------------------------------------


def test_the_engine_accumulates_gradients_in_place_as_on_cuda():
    """Two gradients reaching x: InputBuffer::accumulate adds the new into the old in place on CUDA (the fake
    run's tensor subclasses take ``old + new``: one more 4096 B gradient)."""

    def body(x):
        (x * 2 + x * 3).sum().backward()
        return x.grad

    make = lambda: (torch.randn(1024, requires_grad=True),)  # noqa: E731
    cuda = [s for s in signed(traced(make, body)[0]) if s > 0]
    cpu = [s for s in signed(traced(make, body, cuda=False)[0]) if s > 0]
    assert cpu.count(4096) == cuda.count(4096) + 1


def test_ops_without_a_rule_are_listed_unless_they_allocate_only_their_outputs():
    def body(a):
        q, r = torch.linalg.qr(a)  # cuSOLVER's workspace: no rule
        return torch.softmax(q + r, -1).exp()  # a rule, and element-wise ops: modelled

    trace = traced(lambda: (torch.randn(8, 8),), body)[1]
    assert trace.unmodelled == {"aten.linalg_qr.default"}


def test_cudnn_attention_is_listed_for_its_workspace():
    trace = traced(lambda: _qkv(torch.bfloat16), F.scaled_dot_product_attention)[1]
    assert trace.unmodelled == {"aten._scaled_dot_product_cudnn_attention.default"}


def test_every_rule_names_the_cuda_source_it_models():
    assert len(registry.RULES) >= 25
    for op, found in registry.RULES.items():
        assert found.op is op and found.source.startswith("aten/src/ATen/"), (op, found.source)
        assert registry.unmodelled(op) == bool(found.unmodelled)


def test_a_program_frees_what_it_allocates():
    """Temporaries freed by name, or at the op's end in reverse order: none outlives its op."""
    steps = selection.mbtopk(kernels.gpu("sm90"), 5000, 400, torch.float32)
    live = set()
    for step in steps:
        if isinstance(step, Temp):
            live.add(step.name)
        elif isinstance(step, Free):
            live.remove(step.name)
    assert live == set()
