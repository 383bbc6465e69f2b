"""The shipped suites load and expand to the paper's settings (§3 and the appendix); sweep expansion rules."""

from __future__ import annotations

import pytest

from locations import ROOT, TESTS
from topk_bench.errors import BadInput
from topk_bench.results.frame import load_results
from topk_bench.run import plan as planning
from topk_bench.run.order import Order, size
from topk_bench.run.resolve import Flags

SUITES = ROOT / "suites"


def plan(name: str, flags: Flags | None = None):
    return planning.plan(SUITES / f"{name}.toml", flags or Flags(device="cpu"))


@pytest.mark.parametrize("path", sorted(SUITES.rglob("*.toml")), ids=lambda p: str(p.relative_to(SUITES)))
def test_every_shipped_suite_is_valid(path):
    p = planning.plan(path, Flags(predict=True))
    assert p.cases and len({c.case_id for c in p.cases}) == len(p.cases)


def test_mha_is_figure_1():
    p = plan("mha")
    assert {c.workload for c in p.cases} == {"mha"} and all(c.causal and c.mode == "fwd_bwd" for c in p.cases)
    assert sorted({c.param_dict["seq_len"] for c in p.cases}) == [2**i for i in range(9, 17)]
    assert {(c.param_dict["batch"], c.param_dict["d_model"], c.param_dict["heads"]) for c in p.cases} == {(1, 768, 12)}
    options = {c.impl: c.option_dict for c in p.cases}
    assert set(options) == {"vanilla", "performer", "qchunk", "topk", "sdpa"}
    assert options["performer"]["nb_features"] == 256 and options["qchunk"]["chunk_size"] == 1024
    assert (options["topk"]["topk"], options["topk"]["chunk_size"]) == (128, 1024)
    assert planning.meta(p)["plot"]["panels"] == [[512, 4096], [4096, 65536]]


def test_chunk_size_is_figure_2_with_the_chunk_size_as_a_swept_option():
    p = plan("chunk_size")
    assert all(not c.causal and c.mode == "fwd" and c.param_dict["seq_len"] == 65536 for c in p.cases)
    qchunk = [c for c in p.cases if c.impl == "qchunk"]
    assert [c.option_dict["chunk_size"] for c in qchunk] == [2**i for i in range(7, 14)]
    assert {c.label for c in qchunk} == {"Q-chunking"}  # one curve, not one legend per chunk size
    assert "chunk_size" in p.header and planning.meta(p)["plot"]["x"] == "chunk_size"


def test_ff_is_figure_3b_and_ff_sparse_adds_topk_sparse():
    p = plan("ff")
    assert all(c.activation == "relu" and not c.causal for c in p.cases)
    assert {(c.param_dict["batch"], c.param_dict["seq_len"], c.param_dict["d_model"]) for c in p.cases} == {
        (512, 512, 768)
    }
    assert sorted({c.param_dict["d_ff"] for c in p.cases}) == [2**i for i in range(11, 17)]
    options = {c.impl: c.option_dict for c in p.cases}
    assert options["qchunk"]["chunk_size"] == 2**14 and (options["topk"]["topk"], options["topk"]["chunk_size"]) == (
        512,
        2**14,
    )
    sparse = plan("ff_sparse")
    assert {c.impl for c in sparse.cases} == {"vanilla", "qchunk", "topk", "topk_sparse"}


def test_decoder_is_figure_3a():
    p = plan("decoder")
    assert all(c.param_dict["layers"] == 12 and c.param_dict["batch"] == 1 and c.causal for c in p.cases)
    assert max(c.param_dict["seq_len"] for c in p.cases) == 32768
    topk = next(c for c in p.cases if c.impl == "topk")
    assert (topk.option_dict["topk"], topk.option_dict["chunk_size"]) == (64, 1024)
    assert topk.ff_impl == "qchunk" and topk.ff_option_dict == {"chunk_size": 4096}
    assert next(c for c in p.cases if c.impl == "vanilla").ff_impl == "vanilla"
    assert {"ff_impl", "ff_chunk_size", "layers"} <= set(p.header)


def test_smoke_covers_every_workload_and_implementation():
    import topk_bench.attention

    p = plan("smoke")
    assert {c.workload for c in p.cases} == {"mha", "ff", "decoder", "prefill", "decode"}
    assert {c.mode for c in p.cases if c.workload in ("prefill", "decode")} == {"fwd"}
    paper = {"vanilla", "qchunk", "topk", "topk_sparse", "performer", "sdpa"}
    assert paper <= {c.impl for c in p.cases} and paper <= set(topk_bench.attention.names())
    ff = next(c for c in p.cases if c.workload == "ff")
    assert not ff.causal and ff.activation == "relu" and "heads" not in ff.param_dict
    assert next(c for c in p.cases if c.workload == "decoder").param_dict["layers"] == 2


def test_larger_means_same_implementation_and_options_and_every_swept_shape_value_at_least_as_large(tmp_path):
    (tmp_path / "s.toml").write_text(
        'name = "s"\nworkload = "mha"\n[sweep]\nseq_len = [16, 32]\nchunk_size = [4, 8]\n'
        '[[impl]]\nname = "qchunk"\n[[impl]]\nname = "topk"\ntopk = 2\n'
    )
    cases = planning.plan(tmp_path / "s.toml", Flags(device="cpu")).cases
    keys = ["seq_len", "chunk_size"]
    # The size is the swept shape parameters only; a swept option (chunk_size) stays in the family.
    assert {size(c, keys) for c in cases} == {(16,), (32,)}
    get = {(c.impl, c.param_dict["seq_len"], c.option_dict["chunk_size"]): c for c in cases}
    order = Order(cases, keys)
    small = get[("qchunk", 16, 4)]
    assert order.larger(get[("qchunk", 32, 4)], small)
    assert not order.larger(get[("qchunk", 32, 8)], small)  # another chunk size: another family
    assert not order.larger(get[("qchunk", 16, 8)], small)  # a larger option is not a larger size
    assert not order.larger(get[("qchunk", 16, 4)], small)
    assert not order.larger(get[("topk", 32, 4)], small)


PLUGIN_WORKLOAD_SUITE = """
name = "cross"
workload = "cross_attention"
plugins = ["{plugin}"]
mode = "fwd_bwd"
repeats = 1
warmup = 0
[shape]
d_model = 32
heads = 2
seq_len = 16
[sweep]
memory_len = [32, 64]
[[impl]]
name = "vanilla"
[[impl]]
name = "topk"
topk = 4
chunk_size = 8
"""


@pytest.mark.slow
@pytest.mark.parametrize("predict", [False, True], ids=["measured", "predicted"])
def test_a_workload_registered_by_a_plugin_runs_end_to_end(tmp_path, predict):
    """A plug-in file registers a workload with a parameter only it has (memory_len); `topk-bench run`
    validates the suite against it, measures (or predicts) every case in child processes, and writes the CSV."""
    import subprocess
    import sys

    plugin = TESTS / "plugins" / "cross_attention_workload.py"
    suite = tmp_path / "cross.toml"
    suite.write_text(PLUGIN_WORKLOAD_SUITE.format(plugin=plugin))
    out = tmp_path / "out"
    args = [sys.executable, "-m", "topk_bench", "run", str(suite), "--out", str(out), "--device", "cpu", "-q"]
    result = subprocess.run(args + (["--predict"] if predict else []), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    frame = load_results(out / "cross.csv")
    assert sorted(frame["memory_len"]) == [32, 32, 64, 64] and set(frame["workload"]) == {"cross_attention"}
    assert set(frame["status"]) == {"ok"} and (frame["peak_bytes"] > frame["baseline_bytes"]).all()
    # Twice the memory: vanilla's score matrix grows with it.
    vanilla = frame[frame["impl"] == "vanilla"].sort_values("memory_len")
    assert vanilla["peak_bytes"].iloc[1] > vanilla["peak_bytes"].iloc[0]
    assert frame["method"].iloc[0] == ("predicted" if predict else "measured")

    # The plug-in's own rule and parameter are checked like a built-in workload's.
    suite.write_text(PLUGIN_WORKLOAD_SUITE.format(plugin=plugin).replace('mode = "fwd_bwd"', "causal = true"))
    bad = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.strip().endswith(
        "causal: cross-attention has no causal mask: expected causal = false"
    )


LLAMA, GEMMA, BERT = (32, 8, 128), (8, 1, 256), (12, 12, 64)


def _heads(case):
    return case.param_dict["q_heads"], case.param_dict["kv_heads"], case.param_dict["head_dim"]


def test_decode_is_models_shapes_over_1k_to_1m_cached_tokens_and_64k_measured_on_the_cpu():
    predicted = plan("decode", Flags(predict=True))
    cases = predicted.cases
    assert {c.workload for c in cases} == {"decode"} and all(c.mode == "fwd" and c.causal for c in cases)
    assert {c.dtype for c in cases} == {"bfloat16"} and {c.param_dict["new_tokens"] for c in cases} == {1}
    assert sorted({c.param_dict["kv_len"] for c in cases}) == [2**i for i in range(10, 21)]
    assert {c.param_dict["batch"] for c in cases} == {1, 8}
    assert {(c.param_dict["model"], _heads(c)) for c in cases} == {
        ("llama-3-8b", LLAMA),
        ("gemma-2b", GEMMA),
        ("bert-base", BERT),
    }
    assert {"vanilla", "sdpa", "topk", "topk_fast", "page_topk", "sink_window", "block_topk"} == {c.impl for c in cases}
    measured = plan("decode").cases
    assert max(c.param_dict["kv_len"] for c in measured) == 65536 and len(measured) == len(cases) * 7 // 11
    assert {"kv_cache_bytes", "bytes_per_s", "tokens_per_s", "time_per_token_s"} <= set(predicted.header)
    assert planning.meta(predicted)["plot"]["split"] == ["model"]
    # One new token fits any query chunk: its size says nothing of a decode step, and the legend leaves it out.
    labels = {c.impl: c.label for c in cases}
    assert labels["topk"] == "Top-k (topk=128)" and labels["topk_fast"] == "Top-k fast (topk=128)"
    assert "size=" not in "".join(labels.values())
    assert {c.label for c in plan("demo_time").cases if c.impl == "topk"} == {"Top-k (size=1024, topk=128)"}


def test_prefill_is_models_shapes_over_1k_to_128k_tokens_forward():
    cases = plan("prefill", Flags(predict=True)).cases
    assert {c.workload for c in cases} == {"prefill"} and all(c.mode == "fwd" and c.causal for c in cases)
    assert sorted({c.param_dict["seq_len"] for c in cases}) == [2**i for i in range(10, 18)]
    assert {_heads(c) for c in cases} == {LLAMA, GEMMA, BERT} and {c.dtype for c in cases} == {"bfloat16"}
    assert len(plan("prefill").cases) == len(cases)  # measured: as far as the budgets go


def test_swept_names_are_not_sizes(tmp_path):
    # After a failure at one model, the larger sizes of that model are skipped, never another model's.
    (tmp_path / "s.toml").write_text(
        'name = "s"\nworkload = "decode"\n[sweep]\nkv_len = [16, 32]\nmodel = ["llama-3-8b", "bert-base"]\n'
        '[[impl]]\nname = "vanilla"\n'
    )
    cases = planning.plan(tmp_path / "s.toml", Flags(device="cpu")).cases
    keys = ["kv_len", "model"]
    get = {size(c, keys): c for c in cases}
    order = Order(cases, keys)
    assert order.larger(get[(32, "llama-3-8b")], get[(16, "llama-3-8b")])
    assert not order.larger(get[(32, "llama-3-8b")], get[(16, "bert-base")])
    assert not order.larger(get[(16, "llama-3-8b")], get[(16, "bert-base")])
    assert [size(c, keys) for c in cases] == [
        (16, "llama-3-8b"),
        (16, "bert-base"),
        (32, "llama-3-8b"),
        (32, "bert-base"),
    ]  # sizes smallest first, names as written


def test_max_cases_counts_only_the_cases_a_measured_cpu_run_keeps_under_cpu_max(tmp_path):
    # 3 sizes x 2 models: 6 predicted, 4 measured on the CPU (kv_len 64 is above cpu_max).
    suite = tmp_path / "s.toml"
    suite.write_text(
        'name = "s"\nworkload = "decode"\nmax_cases = 4\n[sweep]\nkv_len = [16, 32, 64]\n'
        'model = ["llama-3-8b", "bert-base"]\n[cpu_max]\nkv_len = 32\n[[impl]]\nname = "sdpa"\n'
    )
    measured = planning.plan(suite, Flags(device="cpu", out=tmp_path / "o"))
    assert len(measured.cases) == 4 and any("cpu_max: 2 case(s) above kv_len <= 32" in n for n in measured.notes)
    with pytest.raises(BadInput, match="6 cases"):
        planning.plan(suite, Flags(predict=True, out=tmp_path / "o"))
    assert len(planning.plan(suite, Flags(predict=True, out=tmp_path / "o"), yes=True).cases) == 6


def test_compile_is_kv_targets_point_eager_and_compiled_side_by_side():
    p = plan("compile")
    targets = plan("kv_targets")
    assert {c.params for c in p.cases} == {targets.cases[0].params}  # the same decode step, the same budget
    assert all(c.dtype == "bfloat16" and c.workload == "decode" for c in p.cases)
    entries = [(c.impl, c.compile, c.compile_mode) for c in p.cases]
    assert entries == [
        ("sdpa", False, None),
        ("page_topk", False, None),
        ("page_topk", True, None),
        ("page_topk", True, "max-autotune-no-cudagraphs"),
        ("topk_fast", False, None),
        ("topk_fast", True, None),
    ]
    # Each compiled entry beside an eager one with the same options; rounds interleave them.
    for c in p.cases:
        if c.compile:
            assert any(e.impl == c.impl and not e.compile and e.options == c.options for e in p.cases)
    assert p.rounds == 3
