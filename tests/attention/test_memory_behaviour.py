"""Memory behaviour the benchmarks rely on, checked with a live-bytes tracker (float32, like the paper)."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from live_bytes import LiveBytes
from topk_bench import attention

# Tiny tensors: a second OpenMP thread costs more than it saves (conftest.single_thread).
pytestmark = pytest.mark.usefixtures("single_thread")

B, H, L, D, C, K = 1, 2, 256, 8, 64, 4
CHUNK_BYTES = B * H * C * L * 4  # one float32 C x Lk matrix (all heads)
GRAD_BYTES = 3 * B * H * L * D * 4  # dq, dk, dv
OPTIONS = {
    "vanilla": {},
    "qchunk": {"chunk_size": C},
    "topk": {"chunk_size": C, "topk": K},
    "topk_sparse": {"chunk_size": C, "topk": K},
}


def profile(name, causal):
    """(bytes kept by the graph after forward, backward peak above that, largest single allocation)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, requires_grad=True) for _ in range(3))
    cotangent = torch.randn(B, H, L, D)
    with LiveBytes(q, k, v, cotangent) as tracker:
        out = attention.get(name)(q, k, v, causal=causal, **OPTIONS[name])
        kept = tracker.poll()
        tracker.reset_peak()
        torch.autograd.backward(out, cotangent)
        backward = tracker.peak - kept
    return kept - out.nbytes, backward, tracker.largest


@pytest.mark.parametrize("causal", [False, True])
def test_what_each_implementation_keeps_for_backward(causal):
    kept = {name: profile(name, causal)[0] for name in OPTIONS}
    assert kept["qchunk"] == 0  # only q, k, v (already there)
    assert kept["topk"] == kept["topk_sparse"] == B * H * L * K * (4 + 8)  # top values + int64 indices
    assert kept["vanilla"] >= B * H * L * L * 4  # the tracker does see a dense graph


@pytest.mark.parametrize("causal", [False, True])
def test_backward_holds_at_most_one_chunk_matrix_for_topk(causal):
    extra = {name: profile(name, causal)[1] - GRAD_BYTES for name in OPTIONS}
    assert extra["topk"] <= 1.1 * CHUNK_BYTES  # paper: either actv or d_dots, never both
    assert extra["topk_sparse"] <= 0.5 * CHUNK_BYTES  # no dense C x Lk at all in backward
    assert 1.9 * CHUNK_BYTES <= extra["qchunk"] <= 2.2 * CHUNK_BYTES  # recomputed weights and their gradient


@pytest.mark.parametrize("name", ["qchunk", "topk", "topk_sparse"])
def test_no_allocation_larger_than_one_chunk_matrix(name):
    # In particular no L x L causal mask (vanilla's largest allocation is L x L).
    assert profile(name, causal=True)[2] <= CHUNK_BYTES
    assert profile("vanilla", causal=True)[2] >= B * H * L * L * 4


def test_causal_performer_memory_is_linear_in_length():
    m, d = 64, 64

    def peak(length):
        with FakeTensorMode():
            torch.manual_seed(0)
            module = attention.spec("performer").module(d, nb_features=m, chunk_size=128)
            q, k, v = (torch.randn(1, 1, length, d, requires_grad=True) for _ in range(3))
            cotangent = torch.randn(1, 1, length, d)
            with LiveBytes(q, k, v, cotangent, module.projection) as tracker:
                torch.autograd.backward(module(q, k, v, causal=True), cotangent)
        return tracker.peak

    small, large = peak(256), peak(1024)
    assert large <= 4.2 * small  # linear, not quadratic
    assert large <= 0.25 * 1024 * m * d * 4  # far below the package fallback's L*m*d floats
