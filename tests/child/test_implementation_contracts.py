"""What an implementation returns, and what it does to its inputs: a wrong shape or dtype is an error,
not a measurement; selection quality reads copies of the inputs."""

from __future__ import annotations

import pytest

# --- what an implementation returns, and what it does to its inputs ------------------------------------

CONTRACT_BREAKERS = """
import torch
from topk_bench import attention
from topk_bench.attention import Implementation

vanilla = attention.get("vanilla")


def narrow(q, k, v, *, causal=False, activation="softmax"):
    return vanilla(q, k, v, causal=causal, activation=activation)[..., :1]     # [B, H, L, 1]: wrong shape


def doubled(q, k, v, *, causal=False, activation="softmax"):
    return vanilla(q, k, v, causal=causal, activation=activation).double()      # the wrong dtype


def zeroes_its_values(q, k, v, *, causal=False, activation="softmax"):
    with torch.no_grad():
        v.zero_()                                                               # its input, in place
    return vanilla(q, k, v, causal=causal, activation=activation)


for _impl in (Implementation("test_narrow", narrow, "wrong shape", predictable=False),
              Implementation("test_doubled", doubled, "wrong dtype", predictable=False),
              Implementation("test_zeroes", zeroes_its_values, "writes into v", predictable=False)):
    if _impl.name not in attention.names():
        attention.register(_impl)
"""


def _prefill_case(tmp_path, impl, **fields):
    from topk_bench.case import Case

    plugin = tmp_path / "breakers.py"
    plugin.write_text(CONTRACT_BREAKERS)
    return Case.make(
        suite="t",
        workload="prefill",
        impl=impl,
        mode="fwd",
        causal=True,
        warmup=0,
        repeats=1,
        params={"seq_len": 32, "batch": 1, "q_heads": 2, "kv_heads": 2, "head_dim": 8},
        plugins=(str(plugin),),
        **fields,
    )


@pytest.mark.parametrize("impl,words", [("test_narrow", "shape [1, 2, 32, 1]"), ("test_doubled", "torch.float64")])
def test_an_output_of_the_wrong_shape_or_dtype_is_an_error_not_a_measurement(tmp_path, impl, words, single_thread):
    """It was recorded ok, with a time and a peak."""
    from topk_bench.child.execute import execute

    result = execute(_prefill_case(tmp_path, impl))
    assert result.status == "error" and result.times_s == [], result
    assert f"implementation '{impl}' returned" in result.error and words in result.error, result.error
    assert "expected [1, 2, 32, 8]" in result.error, result.error


def test_selection_quality_is_computed_on_copies_of_the_inputs(tmp_path, single_thread):
    """An implementation that zeroes its v scored attn_rel_err 0.0: the reference was computed on the zeroed v."""
    from topk_bench.child.execute import execute

    result = execute(_prefill_case(tmp_path, "test_zeroes", quality=("random",)))
    assert result.status == "ok", result.error
    assert result.extra["attn_rel_err"] == pytest.approx(1.0), result.extra
