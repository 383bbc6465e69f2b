"""``protocol = "paper"``: the authors' benchmark (layers, iterations, statistics), and ours left as it was."""

from __future__ import annotations

import dataclasses
import json
import weakref

import pytest
import torch

from locations import ROOT, TESTS
from topk_bench import attention, protocol
from topk_bench.case import Case
from topk_bench.child.execute import execute, measure
from topk_bench.measure import backends
from topk_bench.run import plan as planning
from topk_bench.run.resolve import Flags
from topk_bench.workloads import build

pytestmark = pytest.mark.usefixtures("single_thread")

L, D_MODEL, HEADS = 32, 16, 2  # head_dim 8

SUITE = f"""
name = "tiny"
workload = "mha"
causal = true
protocol = "paper"
[shape]
d_model = {D_MODEL}
heads = {HEADS}
[sweep]
seq_len = [{L}]
[[impl]]
name = "vanilla_paper"
[[impl]]
name = "qchunk_paper"
chunk_size = 8
[[impl]]
name = "sdpa"
"""


def case(impl: str, proto: str = "paper", workload: str = "mha", **fields) -> Case:
    params = {"seq_len": L, "d_model": D_MODEL, "heads": HEADS}
    if workload == "decoder":
        params.update(d_ff=32, layers=2)
    options = {"chunk_size": 8} if "chunk_size" in attention.spec(impl).options else {}
    fields = {"causal": True, "warmup": 0, "repeats": 1, **fields}
    return Case.make(suite="t", workload=workload, impl=impl, params=params, options=options, protocol=proto, **fields)


def test_our_case_ids_are_those_of_before_the_protocol_existed():
    ours = Case.make(
        suite="mha",
        workload="mha",
        impl="topk",
        params={"seq_len": 1024, "batch": 1, "d_model": 768, "heads": 12},
        options={"topk": 128, "chunk_size": 1024},
        causal=True,
    )
    assert (
        ours.case_id == "3af4ab3124c9c2ad"
    )  # computed before this key existed (tests/suite/test_ci_suite_and_baseline.py: all of ci.toml)
    paper = Case.make(**{**_fields(ours), "protocol": "paper"})
    assert paper.case_id != ours.case_id
    assert Case.from_json(paper.to_json()) == paper and Case.from_json(paper.to_json()).protocol == "paper"


def _fields(c: Case) -> dict:
    return {
        "suite": c.suite,
        "workload": c.workload,
        "impl": c.impl,
        "params": dict(c.params),
        "options": dict(c.options),
        "causal": c.causal,
    }


def test_a_paper_suite_plans_paper_cases(tmp_path):
    (tmp_path / "tiny.toml").write_text(SUITE)
    p = planning.plan(tmp_path / "tiny.toml", Flags(device="cpu"))
    assert {c.protocol for c in p.cases} == {"paper"}
    assert {(c.warmup, c.repeats) for c in p.cases} == {(0, 3)}  # fixed by the protocol, not bench.toml's
    # The protocol's options are its own: not in the cases (nor their CSV columns).
    assert all("scale" not in c.option_dict and "mask" not in c.option_dict for c in p.cases)
    assert next(c for c in p.cases if c.impl == "qchunk_paper").option_dict == {"chunk_size": 8, "dropout": 0.1}
    assert "protocol" in p.header and planning.meta(p)["protocol"] == "paper"
    (tmp_path / "ours.toml").write_text(SUITE.replace('protocol = "paper"', ""))
    ours = planning.plan(tmp_path / "ours.toml", Flags(device="cpu"))
    assert "protocol" not in ours.header and {c.protocol for c in ours.cases} == {"ours"}
    assert not {c.case_id for c in ours.cases} & {c.case_id for c in p.cases}


def test_paper_layers_scale_inside_and_vanilla_keeps_its_whole_mask():
    wl = build(case("vanilla_paper"), "cpu", torch.float32)
    assert wl.model.scale_in_attention and wl.model.attention.options["scale"] == 8**-0.5
    (mask,) = wl.kept
    assert mask.dtype == torch.bool and torch.equal(mask, torch.ones(L, L, dtype=torch.bool).triu(1))
    assert wl.model.attention.options["mask"] is mask
    chunked = build(case("qchunk_paper"), "cpu", torch.float32)  # builds a C x L mask per chunk, measured
    assert chunked.model.scale_in_attention and chunked.kept == ()
    for impl in ("sdpa", "vanilla"):  # no scale option: they keep receiving a scaled q
        other = build(case(impl), "cpu", torch.float32)
        assert not other.model.scale_in_attention and other.kept == ()
    ours = build(case("vanilla_paper", "ours"), "cpu", torch.float32)
    assert not ours.model.scale_in_attention and ours.kept == () and ours.model.attention.options["scale"] == 1.0
    non_causal = build(case("vanilla_paper", causal=False), "cpu", torch.float32)
    assert non_causal.model.scale_in_attention and non_causal.kept == ()


def test_a_paper_decoder_shares_one_mask_across_its_layers():
    wl = build(case("vanilla_paper", workload="decoder", ff_impl="vanilla_paper"), "cpu", torch.float32)
    (mask,) = wl.kept
    assert all(
        block.mha.attention.options["mask"] is mask and block.mha.scale_in_attention for block in wl.model.blocks
    )
    assert all(block.ff.attention.options["mask"] is None for block in wl.model.blocks)  # FF: no mask


@pytest.mark.parametrize("impl", ["vanilla_paper", "qchunk_paper"])
def test_the_kept_mask_moves_from_the_peak_into_the_baseline(impl):
    paper = execute(case(impl, method="predicted"))
    ours = execute(case(impl, "ours", method="predicted"))
    assert paper.status == ours.status == "ok", (paper.error, ours.error)
    mask = L * L if impl == "vanilla_paper" else 0  # one byte per pair, vanilla's only
    assert paper.baseline_bytes == ours.baseline_bytes + mask
    measured = execute(case(impl))
    assert (measured.peak_bytes, measured.baseline_bytes) == (paper.peak_bytes, paper.baseline_bytes)


class Recorder:
    """Every build and iteration of a measured case, in order, with the workload it ran on."""

    def __init__(self, monkeypatch):
        self.events: list[tuple[str, int]] = []
        self.built: list[weakref.ref] = []
        self.earlier_alive: list[bool] = []  # at each build: is an earlier workload still alive?
        real_build, real_iteration = backends.build, backends.iteration

        def recording_build(c, device):
            self.earlier_alive.append(any(ref() is not None for ref in self.built))
            wl = real_build(c, device)
            self.built.append(weakref.ref(wl.model))
            self.events.append(("build", len(self.built)))
            return wl

        def recording_iteration(wl, c, clock=None, losses=None):
            index = next(i for i, ref in enumerate(self.built, 1) if ref() is wl.model)
            self.events.append(("timed" if clock else "untimed", index))
            return real_iteration(wl, c, clock, losses)

        monkeypatch.setattr(backends, "build", recording_build)
        monkeypatch.setattr(backends, "iteration", recording_iteration)
        ticks = iter(range(10_000))
        monkeypatch.setattr(backends.time, "perf_counter", lambda: float(next(ticks)))


def test_paper_iterations_are_cold_rebuilt_and_three(monkeypatch):
    rec = Recorder(monkeypatch)
    m = measure(case("qchunk_paper", warmup=0, repeats=3))
    # No warm-up: the first iteration is timed; each on a fresh model and inputs built outside the
    # timed region; the untimed profiling iteration (live bytes, FLOPs) last, on a fresh one too.
    assert rec.events == [
        ("build", 1),
        ("timed", 1),
        ("build", 2),
        ("timed", 2),
        ("build", 3),
        ("timed", 3),
        ("build", 4),
        ("untimed", 4),
    ]
    assert rec.earlier_alive == [False] * 4  # each freed before the next is built (their `del Q, model, ...`)
    assert m.times_s == [2.0, 2.0, 2.0] and m.time_mean_s == 2.0  # the fake clock ticks once a call
    assert m.peak_bytes > m.baseline_bytes > 0 and m.flops > 0


def test_our_iterations_warm_up_one_workload_then_time_it(monkeypatch):
    rec = Recorder(monkeypatch)
    measure(case("qchunk_paper", "ours", warmup=2, repeats=3))
    # The profiling iteration is the first warm-up; after the peak reset one more untimed iteration, so that
    # no timed one allocates what the emptied cache gave back.
    assert rec.events == [("build", 1), ("untimed", 1), ("untimed", 1), ("untimed", 1)] + [("timed", 1)] * 3


def test_drawn_metrics():
    assert protocol.drawn_metric("time", "paper", "cuda", "measured") == "time_mean"
    assert protocol.drawn_metric("memory", "paper", "cuda", "measured") == "reserved"
    assert protocol.drawn_metric("memory", "paper", "cpu", "measured") == "memory"  # no reserved bytes there
    assert protocol.drawn_metric("memory", "paper", "cpu", "predicted") == "memory"
    assert protocol.drawn_metric("time", "ours", "cuda", "measured") == "time"
    assert protocol.drawn_metric("memory", "ours", "cuda", "measured") == "memory"


def test_a_paper_figure_draws_reserved_bytes_and_mean_times(tmp_path):
    import matplotlib.pyplot as plt

    from topk_bench.case import Measurement
    from topk_bench.report.plots.figure import draw_figure
    from topk_bench.report.plots.inputs import figure_inputs
    from topk_bench.results.columns import header
    from topk_bench.results.row import make_row, parameters
    from topk_bench.results.store import append_row

    out = tmp_path / "r"
    out.mkdir()
    rows = []
    for n in (512, 1024):
        c = Case.make(
            suite="p", workload="mha", impl="vanilla_paper", params={"seq_len": n}, device="cuda", protocol="paper"
        )
        rows.append(
            (
                c,
                Measurement(
                    status="ok", device_name="GPU", peak_bytes=n << 20, reserved_bytes=n << 21, times_s=[3.0, 1.0, 1.0]
                ),
            )
        )
    columns = header(list(parameters(rows[0][0])))
    for c, m in rows:
        columns = append_row(out / "p.csv", make_row(c, m), columns)
    (out / "p.meta.json").write_text(json.dumps({"suite": "p", "protocol": "paper", "plot": {"x": "seq_len"}}))
    (item,) = figure_inputs(out)
    assert item.spec.protocol == "paper"
    fig = draw_figure(item.rows, item.spec, item.device, item.method)
    try:
        memory, time = fig.axes
        assert memory.get_ylabel() == "peak reserved memory (GiB)" and time.get_ylabel() == "time, mean (s)"
        assert list(memory.get_lines()[0].get_ydata()) == [1.0, 2.0]  # reserved: 2 MiB per token, in GiB
        assert list(time.get_lines()[0].get_ydata()) == [5 / 3, 5 / 3]  # the mean, not the median (1.0)
        assert "paper protocol" in fig._suptitle.get_text()
    finally:
        plt.close(fig)
    (out / "p.meta.json").unlink()  # without meta.json, the CSV's protocol column says it
    assert figure_inputs(out)[0].spec.protocol == "paper"


def test_predicting_cuda_under_the_paper_protocol_is_unsupported_not_wrong():
    # The simulated caching allocator replays our sequence (one build, warm-up, peaks reset); a paper case's
    # reserved bytes would come from the wrong sequence, so it is refused with a reason rather than predicted.
    paper = execute(case("qchunk_paper", device="cuda", method="predicted"))
    assert paper.status == "unsupported" and "'paper'" in paper.error, paper.error
    ours = execute(case("qchunk_paper", "ours", device="cuda", method="predicted"))
    assert ours.status == "ok" and ours.reserved_bytes >= ours.peak_bytes > ours.baseline_bytes


def test_paper_suites_are_the_figures_under_the_paper_protocol():
    suites = ROOT / "suites" / "paper"
    plans = {p.stem: planning.plan(p, Flags(predict=True)) for p in sorted(suites.glob("*.toml"))}
    assert {"mha", "chunk_size", "ff", "ff_sparse", "decoder"} <= set(plans)
    for name, p in plans.items():
        assert {c.protocol for c in p.cases} == {"paper"}, name
    impls = {name: {c.impl for c in p.cases} for name, p in plans.items()}
    assert impls["mha"] == {"vanilla_paper", "qchunk_paper", "topk_paper", "performer", "sdpa"}
    assert impls["chunk_size"] == {"qchunk_paper", "topk_paper"}
    assert impls["ff"] == {"vanilla_paper", "qchunk_paper", "topk_paper"}
    assert impls["ff_sparse"] == impls["ff"] | {"topk_sparse"}
    assert impls["decoder"] == {"vanilla_paper", "performer", "qchunk_paper", "topk_paper"}
    mha = {c.impl: c for c in plans["mha"].cases if c.param_dict["seq_len"] == 65536}
    assert mha["topk_paper"].option_dict == {"topk": 128, "chunk_size": 1024, "dropout": 0.1}
    assert all(c.causal and c.mode == "fwd_bwd" for c in plans["mha"].cases)
    assert all(c.mode == "fwd" and c.param_dict["seq_len"] == 65536 for c in plans["chunk_size"].cases)
    ff = {c.impl: c for c in plans["ff"].cases}
    assert ff["topk_paper"].option_dict == {"topk": 512, "chunk_size": 2**14, "dropout": 0.1}
    assert {(c.param_dict["batch"], c.param_dict["seq_len"]) for c in plans["ff"].cases} == {(512, 512)}
    decoder = {c.impl: c for c in plans["decoder"].cases}
    assert (decoder["topk_paper"].option_dict["topk"], decoder["topk_paper"].ff_impl) == (64, "qchunk_paper")
    assert decoder["topk_paper"].ff_option_dict == {"chunk_size": 4096, "dropout": 0.1}
    assert decoder["vanilla_paper"].ff_impl == decoder["performer"].ff_impl == "vanilla_paper"


def test_a_paper_case_checks_the_numbers_of_its_last_timed_iteration():
    # Each timed iteration has its own workload under the paper protocol: the NaN check must still see the
    # last one's gradients (it is freed only after the check), and the case keeps its measurement.
    plugin = str(TESTS / "plugins" / "nonfinite_impls.py")
    nan = Case.make(
        suite="t",
        workload="mha",
        impl="nan_gradient",
        params={"seq_len": L, "d_model": D_MODEL, "heads": HEADS},
        warmup=0,
        repeats=3,
        protocol="paper",
        plugins=(plugin,),
    )
    result = execute(nan)
    assert result.status == "nonfinite" and "gradient" in result.error, result.error
    assert len(result.times_s) == 3 and result.peak_bytes > result.baseline_bytes > 0


def with_options(c: Case, **options) -> Case:
    return dataclasses.replace(c, options=tuple({**c.option_dict, **options}.items()))


@pytest.mark.parametrize("impl", ["vanilla_paper", "qchunk_paper", "topk_paper"])
def test_dropout_stays_on_in_forward_only_runs(impl):
    # Theirs was a closure with training=True: on even in a forward-only run, whatever the module's mode.
    fwd = case(impl, mode="fwd")
    if impl == "topk_paper":
        fwd = with_options(fwd, topk=4)
    # No dropout option: the variant's default, 0.1, which the paper protocol keeps (a planned case shows it).

    def two_forwards(c: Case) -> tuple[torch.Tensor, torch.Tensor]:
        wl = backends.build(c, "cpu")
        wl.model.eval()
        with torch.no_grad():
            return wl(), wl()

    assert not torch.equal(*two_forwards(fwd))  # a new mask each forward
    assert torch.equal(*two_forwards(with_options(fwd, dropout=0.0)))
    dropped = execute(dataclasses.replace(fwd, method="predicted"))
    kept = execute(dataclasses.replace(with_options(fwd, dropout=0.0), method="predicted"))
    assert dropped.peak_bytes > kept.peak_bytes  # the forward holds dropout's blocks too
