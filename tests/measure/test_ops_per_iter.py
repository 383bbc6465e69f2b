"""``ops_per_iter``: the aten ops one iteration dispatches, on every backend; ``sdpa_backend``: what SDPA ran.

A dispatch mode counts what reaches the kernels, so a prediction counts exactly what a measurement does;
a compiled call is counted from the profiler's trace (no dispatch mode can follow it).
"""

from __future__ import annotations

import textwrap
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import topk_bench.attention
from topk_bench.case import Case
from topk_bench.child.execute import measure
from topk_bench.measure.ops import OpCounter, profiled
from topk_bench.results import columns as col

DECODE = {"kv_len": 96, "q_heads": 4, "kv_heads": 2, "head_dim": 16, "budget": 32}
# Every selection method that runs eagerly, and dense attention beside them (flex compiles: below, slow).
SELECTION = sorted(i.name for i in topk_bench.attention.all_specs() if i.selection is not None and not i.compiles)
EAGER = ["vanilla", "sdpa", *SELECTION]


def decode(impl: str, **fields) -> Case:
    from topk_bench.workloads.attention import with_budget

    return Case.make(
        suite="t",
        workload="decode",
        impl=impl,
        params=DECODE,
        options=with_budget(impl, {}, 32),
        mode="fwd",
        causal=True,
        warmup=1,
        repeats=1,
        **fields,
    )


def test_every_selection_method_is_counted():
    assert {"topk", "topk_fast", "topk_sparse", "page_topk", "sink_window", "block_topk"} <= set(SELECTION)


@pytest.mark.parametrize("impl", EAGER)
def test_a_decode_step_dispatches_as_many_ops_measured_as_predicted(impl, single_thread):
    measured = measure(decode(impl))
    predicted = measure(decode(impl, method="predicted"))
    assert measured.status == predicted.status == "ok", (measured.error, predicted.error)
    assert measured.extra[col.OPS_PER_ITER] == predicted.extra[col.OPS_PER_ITER] > 0
    expected = "flash_attention" if impl == "sdpa" else ""  # the CPU's fused SDPA kernel
    assert measured.extra[col.SDPA_BACKEND] == predicted.extra[col.SDPA_BACKEND] == expected


def test_backward_ops_are_counted_too(single_thread):
    params = {"seq_len": 16, "d_model": 16, "heads": 2}
    fwd = measure(Case.make(suite="t", workload="mha", impl="vanilla", params=params, mode="fwd", repeats=1))
    both = measure(Case.make(suite="t", workload="mha", impl="vanilla", params=params, repeats=1))
    assert both.extra[col.OPS_PER_ITER] > 2 * fwd.extra[col.OPS_PER_ITER]


def test_the_counter_names_the_sdpa_backend_that_ran():
    q = torch.randn(1, 2, 8, 16)
    for backend, expected in ((SDPBackend.FLASH_ATTENTION, "flash_attention"), (SDPBackend.MATH, "math")):
        counter = OpCounter()
        with sdpa_kernel(backend), counter:
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
        assert counter.counted.sdpa_backend == expected
    counter = OpCounter()
    with counter:
        torch.softmax(q @ q.transpose(-1, -2), -1) @ q
    assert counter.counted.sdpa_backend == ""  # dense attention by hand is no SDPA call
    one = OpCounter()
    with one:
        q + q
    assert one.counted.ops == 1


def event(name: str, parent=None):
    return SimpleNamespace(name=name, cpu_parent=parent)


def test_a_profiled_iteration_counts_the_ops_dispatched_from_outside_other_ops_and_each_compiled_graph():
    region = event("Torch-Compiled Region: 0/0")
    graph = event("## Call CompiledFxGraph f7x ##", region)
    extern = event("aten::_scaled_dot_product_efficient_attention", graph)  # an extern kernel of the graph
    inner = event("aten::empty", extern)  # called by the kernel above: not a dispatch of the iteration's code
    copy = event("aten::copy_")  # eager code around the compiled call
    assert profiled([region, graph, extern, inner, copy, event("ProfilerStep")]).ops == 3
    counted = profiled([region, graph, extern, inner, copy])
    assert counted.sdpa_backend == "efficient_attention"


def test_a_decode_suite_has_ops_per_iter_on_every_row_measured_and_predicted(tmp_path):
    from topk_bench import run_suite

    entries = "".join(f'[[impl]]\nname = "{name}"\n' for name in EAGER)
    path = tmp_path / "d.toml"
    path.write_text(
        textwrap.dedent("""
        name = "d"
        workload = "decode"
        repeats = 1
        [shape]
        kv_len = 96
        q_heads = 4
        kv_heads = 2
        head_dim = 16
        [sweep]
        budget = [32]
    """)
        + entries
    )
    measured = run_suite(path, device="cpu", out=str(tmp_path / "m"), warmup_s=0.0)
    predicted = run_suite(path, predict=True, out=str(tmp_path / "p"))
    assert list(measured[col.IMPL]) == EAGER and set(measured[col.STATUS]) == {"ok"}
    assert (measured[col.OPS_PER_ITER] > 0).all()
    ops = [dict(zip(frame[col.IMPL], frame[col.OPS_PER_ITER])) for frame in (measured, predicted)]
    assert ops[0] == ops[1]
    assert set(measured[col.TIMER]) == {"perf_counter"} and predicted[col.TIMER].isna().all()


@pytest.mark.slow  # compiles FlexAttention
def test_a_compiled_decode_step_is_counted_from_the_profiler():
    m = measure(decode("flex"))
    assert m.status == "ok", m.error
    # The cache write's copies and slices, and one compiled graph: a handful, not the eager path's dozens.
    assert 0 < m.extra[col.OPS_PER_ITER] < 20 and m.extra[col.COMPILE_S] > 0
