"""``compile = true`` on an ``[[impl]]``: torch.compile of its attention, eager and compiled side by side.

The suite keys and what they are checked against run without compiling; what compiles (inductor's C++
backend on the CPU: tens of seconds on 2 loaded cores) is ``slow``.
"""

from __future__ import annotations

import textwrap
from dataclasses import replace

import pytest
import torch

from topk_bench.case import Case
from topk_bench.errors import BadInput
from topk_bench.measure import backends
from topk_bench.measure.compiled import attention_modules, compile_attention
from topk_bench.results import columns as col
from topk_bench.run.plan import plan
from topk_bench.run.resolve import Flags
from topk_bench.workloads import build as build_workload

DECODE = {"kv_len": 96, "q_heads": 4, "kv_heads": 2, "head_dim": 16}


def suite(tmp_path, body: str, name: str = "c") -> str:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        textwrap.dedent(f'''
        name = "{name}"
        workload = "decode"
        repeats = 3
        [shape]
        kv_len = 96
        q_heads = 4
        kv_heads = 2
        head_dim = 16
        [sweep]
        budget = [32]
    ''')
        + textwrap.dedent(body)
    )
    return str(path)


SIDE_BY_SIDE = """
    [[impl]]
    name = "page_topk"
    page_size = 8
    [[impl]]
    name = "page_topk"
    page_size = 8
    compile = true
    [[impl]]
    name = "page_topk"
    page_size = 8
    compile = true
    compile_mode = "max-autotune-no-cudagraphs"
"""


def test_eager_and_compiled_entries_are_cases_of_their_own(tmp_path):
    cases = plan(suite(tmp_path, SIDE_BY_SIDE), Flags(device="cpu", out=tmp_path / "out")).cases
    assert [c.compile for c in cases] == [False, True, True]
    assert [c.compile_mode for c in cases] == [None, None, "max-autotune-no-cudagraphs"]
    assert len({c.case_id for c in cases}) == 3  # ids differ: they are side by side in one CSV
    assert [c.label for c in cases] == [
        "page_topk",
        "page_topk (compiled)",
        "page_topk (compiled, max-autotune-no-cudagraphs)",
    ]
    # The eager case keeps the id it had before compile existed (compile only enters an id when set).
    assert cases[0].case_id == replace(cases[1], compile=False, compile_mode=None, label=cases[0].label).case_id


@pytest.mark.parametrize(
    "body, key, message",
    [
        (
            '[[impl]]\nname = "vanilla"\ncompile_mode = "max-autotune"\n',
            "impl[0] (vanilla).compile_mode",
            "compile_mode without compile = true",
        ),
        ('[[impl]]\nname = "flex"\ncompile = true\n', "impl[0] (flex).compile", "compiles itself"),
        (
            '[[impl]]\nname = "vanilla"\ncompile = true\ncompile_mode = "fastest"\n',
            "impl[0] (vanilla).compile_mode",
            "expected 'default', 'reduce-overhead', 'max-autotune' or 'max-autotune-no-cudagraphs', got 'fastest'",
        ),
    ],
)
def test_compile_keys_are_checked(tmp_path, body, key, message):
    with pytest.raises(BadInput) as raised:
        plan(suite(tmp_path, body), Flags(device="cpu", out=tmp_path / "out"))
    assert key in str(raised.value) and message in str(raised.value)


def test_the_paper_protocol_refuses_compile(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(
        'name = "p"\nworkload = "mha"\nprotocol = "paper"\n[sweep]\nseq_len = [64]\n'
        '[[impl]]\nname = "vanilla_paper"\ncompile = true\n'
    )
    with pytest.raises(BadInput, match="protocol 'paper' builds a model per timed iteration"):
        plan(str(path), Flags(device="cpu", out=tmp_path / "out"))


def test_a_compiled_case_is_not_predicted(tmp_path):
    case = Case.make(suite="t", workload="decode", impl="vanilla", params=DECODE, method="predicted", compile=True)
    from topk_bench.child.execute import execute

    m = execute(case)
    assert m.status == "unsupported" and "compile = true: a compiled case is measured, not predicted" in m.error


@pytest.mark.parametrize(
    "workload, params, expected",
    [
        ("mha", {"seq_len": 16, "d_model": 16, "heads": 2}, ["attention"]),
        ("decode", DECODE, ["layer.attention"]),
        ("prefill", {"seq_len": 16, "q_heads": 2, "kv_heads": 1, "head_dim": 8}, ["attention"]),
        ("ff", {"seq_len": 16, "d_model": 16, "d_ff": 32}, ["attention"]),
    ],
)
def test_every_workload_names_its_attention_modules(workload, params, expected):
    case = Case.make(
        suite="t",
        workload=workload,
        impl="vanilla",
        params=params,
        activation="relu" if workload == "ff" else "softmax",
    )
    wl = build_workload(case, "cpu", torch.float32)
    assert [name for name, _ in attention_modules(wl.model)] == expected


def test_the_decoder_compiles_each_block_attention_and_feed_forward_once():
    case = Case.make(
        suite="t",
        workload="decoder",
        impl="vanilla",
        params={"seq_len": 16, "d_model": 16, "heads": 2, "d_ff": 32, "layers": 2},
    )
    wl = build_workload(case, "cpu", torch.float32)
    names = compile_attention(wl.model)
    assert len(names) == 4 and all(n.endswith("attention") for n in names)  # 2 layers x (attention, feed-forward)
    # torch.compile is lazy: nothing compiled yet, and no module is compiled inside another.
    assert not any(a != b and b.startswith(f"{a}.") for a in names for b in names)


def test_a_model_without_attention_modules_is_said_so():
    with pytest.raises(ValueError, match="no attention module to compile"):
        compile_attention(torch.nn.Sequential(torch.nn.Linear(2, 2)))


@pytest.mark.slow  # inductor compiles the decode step's attention (C++ backend): ~30 s on 2 loaded cores
def test_a_suite_measures_eager_and_compiled_side_by_side_on_the_cpu(tmp_path):
    from topk_bench import run_suite

    body = '[[impl]]\nname = "page_topk"\npage_size = 8\n[[impl]]\nname = "page_topk"\npage_size = 8\ncompile = true\n'
    frame = run_suite(
        suite(tmp_path, body), device="cpu", out=str(tmp_path / "out"), warmup_s=0.0, max_case_seconds=900
    )  # compiling takes minutes on a loaded 2-core machine
    eager, compiled = frame.iloc[0], frame.iloc[1]
    assert list(frame[col.STATUS]) == ["ok", "ok"], list(frame[col.ERROR])
    assert compiled[col.LABEL] == "page_topk (compiled)" and compiled["compile"] in (True, "True")
    assert eager["compile"] != eager["compile"]  # empty: the eager row's cell
    # The compilation is outside the timed samples, in compile_s; the eager row has none.
    assert compiled[col.COMPILE_S] > 1.0 > max(float(t) for t in compiled[col.TIMES_S].split(";"))
    assert eager[col.COMPILE_S] != eager[col.COMPILE_S]
    # Ops: the compiled graph is one call where eager code dispatches each op.
    assert 0 < compiled[col.OPS_PER_ITER] < eager[col.OPS_PER_ITER]
    # Memory of the compiled call from the allocator's reports (no dispatch mode can follow it); above the cache.
    assert compiled[col.PEAK_BYTES] > compiled[col.BASELINE_BYTES] == eager[col.BASELINE_BYTES]
    assert compiled[col.TIMER] == eager[col.TIMER] == "perf_counter"


@pytest.mark.slow  # compiles
def test_the_compiled_step_computes_what_the_eager_one_does():
    case = Case.make(
        suite="t",
        workload="decode",
        impl="page_topk",
        params={**DECODE, "budget": 32},
        options={"page_size": 8, "token_budget": 32},
        mode="fwd",
    )
    eager = backends.build(case, "cpu")
    compiled = backends.build(replace(case, compile=True), "cpu")
    with torch.no_grad():
        torch.testing.assert_close(compiled(), eager(), rtol=1e-5, atol=1e-6)
