"""flex: compiled FlexAttention with causal and sliding-window block masks (forward only on CPU).

Compiling a FlexAttention kernel takes ~20 s per shape and mask on a 2-core CPU, so
the equality tests are ``slow``; the refusals and the masks run without compiling.
"""

import dataclasses

import pytest
import torch

from topk_bench import attention
from topk_bench.attention.methods import flex
from topk_bench.case import Case

pytestmark = pytest.mark.usefixtures("single_thread")


def inputs(b, hq, hkv, lq, lk, d=8, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, hq, lq, d, generator=g, dtype=dtype),
        torch.randn(b, hkv, lk, d, generator=g, dtype=dtype),
        torch.randn(b, hkv, lk, d, generator=g, dtype=dtype),
    )


def dense_masked(q, k, v, selected):
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    scores = (q @ k.transpose(-2, -1)).masked_fill(~selected, float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v


def test_cpu_backward_is_unsupported_before_any_compilation():
    q, k, v = (t.requires_grad_() for t in inputs(1, 2, 1, 3, 5))
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        flex.flex_attention(q, k, v, causal=True)
    with pytest.raises(ValueError, match="softmax"):
        flex.flex_attention(q, k, v, activation="relu")
    with pytest.raises(ValueError, match="window"):
        flex.flex_attention(q.detach(), k.detach(), v.detach(), window=-1)
    with pytest.raises(NotImplementedError, match="float64"):
        flex.flex_attention(q.detach(), k.detach(), v.detach())


@pytest.mark.parametrize("lq,lk", [(4, 9), (9, 9), (9, 4)])
def test_selection_masks(lq, lk):
    q, k, _ = inputs(1, 2, 1, lq, lk)
    for causal in (False, True):
        for window in (0, 3):
            got = flex.flex_selection(q, k, causal=causal, window=window)
            for i in range(lq):
                pos = lk - lq + i
                for j in range(lk):
                    if window:
                        want = pos - window < j <= pos
                    else:
                        want = j <= pos or not causal
                    assert bool(got[0, 1, i, j]) == want, (causal, window, i, j)


def test_registry_entry():
    spec = attention.spec("flex")
    assert not spec.predictable and spec.gqa == "native" and spec.activations == ("softmax",)
    assert spec.selection is flex.flex_selection and spec.legend() == "FlexAttention (window=0)"


@pytest.mark.slow
def test_compiled_forward_equals_dense_masked_attention():
    # Decode-like (Lq < Lk), GQA, float32 (CPU FlexAttention has no float64): each (causal, window)
    # compiles once. The reference runs in float64.
    q, k, v = inputs(1, 4, 2, 3, 37, dtype=torch.float32)
    with torch.no_grad():
        for causal, window in ((False, 0), (True, 0), (True, 8)):
            seconds = flex.warm_up(q, k, v, causal=causal, window=window)
            got = flex.flex_attention(q, k, v, causal=causal, window=window)
            want = dense_masked(
                q.double(), k.double(), v.double(), flex.flex_selection(q, k, causal=causal, window=window)
            )
            assert got.dtype == torch.float32
            torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5)
            assert seconds > 0
        # A sliding window is sink_window without sinks.
        sw = attention.get("sink_window")(q, k, v, causal=True, sinks=0, window=8)
        torch.testing.assert_close(flex.flex_attention(q, k, v, causal=True, window=8), sw, rtol=0, atol=1e-5)
        # Rows before the first key (causal, Lq > Lk) give zeros.
        q9, k4, v4 = inputs(1, 2, 2, 9, 4, dtype=torch.float32)
        out = flex.flex_attention(q9, k4, v4, causal=True)
        assert out[:, :, :5].abs().max() == 0 and torch.isfinite(out).all()


@pytest.mark.slow  # compiles FlexAttention (about 20 s on 2 cores)
def test_flex_compile_time_is_its_own_column_and_not_in_the_timed_samples():
    import time

    from topk_bench.measure import backends, iterations

    case = Case.make(
        suite="t",
        workload="decode",
        impl="flex",
        params={"kv_len": 63, "q_heads": 2, "kv_heads": 1, "head_dim": 16},
        mode="fwd",
        causal=True,
        dtype="float32",
        warmup=0,
        repeats=3,
    )
    calls = []

    class Steps(iterations.Steps):  # the CPU's steps without the live-bytes tracker
        def build(self):
            return backends.build(case, "cpu")

        def profile(self, wl):
            calls.append("profile")
            backends.iteration(wl, case)

        def warm_up(self, wl):
            calls.append("warm_up")
            backends.iteration(wl, case)

        def timed(self, wl):
            calls.append("timed")
            sample = backends.iteration(wl, case, time.perf_counter)
            return lambda: sample

    steps = Steps()
    samples = iterations.run(case, steps)
    # warmup = 0 still runs the compiling call first, untimed; the timed calls (after the untimed one that
    # follows the peak reset) reuse its kernel.
    assert calls == ["warm_up", "profile", "warm_up", "timed", "timed", "timed"]
    assert steps.compile_s > 10 * max(f + b for f, b in samples)
    assert not iterations.compiles(dataclasses.replace(case, impl="sdpa"))


@pytest.mark.slow  # compiles FlexAttention (about 5-20 s on 2 cores)
def test_flex_forward_is_measured_on_the_cpu_with_its_compile_time_apart():
    # No dispatch mode can follow the compiled call: its peak comes from the allocator's reports.
    from topk_bench.child.execute import execute
    from topk_bench.results.columns import COMPILE_S as COMPILE_COLUMN

    case = Case.make(
        suite="t",
        workload="prefill",
        impl="flex",
        params={"seq_len": 64, "q_heads": 2, "kv_heads": 1, "head_dim": 16},
        mode="fwd",
        causal=True,
        dtype="float32",
        warmup=1,
        repeats=3,
    )
    result = execute(case)
    assert result.status == "ok", result.error
    assert result.extra[COMPILE_COLUMN] > 10 * max(result.times_s)
    output = 2 * 64 * 16 * 4  # [1, 2, 64, 16] float32
    assert result.peak_bytes - result.baseline_bytes >= output
    assert result.flops is None  # the FLOP counter is a mode too


def test_what_this_torch_cannot_do_is_an_unsupported_row_not_an_error():
    # flex.py documents it: its NotImplementedError (here: no FlexAttention backward on CPU) is the
    # harness's `unsupported`, as is torch's own (a higher-order op a mode cannot follow).
    from topk_bench.case import Budget, Case
    from topk_bench.child.execute import classify, execute

    case = Case.make(
        suite="t",
        workload="mha",
        impl="flex",
        params={"seq_len": 8, "d_model": 8, "heads": 2},
        causal=True,
        warmup=0,
        repeats=1,
    )
    result = execute(case)
    assert result.status == "unsupported" and "backward on CPU" in result.error, result.error
    status, message = classify(NotImplementedError("There was no rule registered for HigherOrderOperator"), Budget())
    assert status == "unsupported" and "HigherOrderOperator" in message
