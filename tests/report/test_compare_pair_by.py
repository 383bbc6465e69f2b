"""``compare BASE NEW --pair-by impl,seq_len``: an A/B of an option. Two runs that differ in chunk_size share no
case_id; paired on the columns named, they are compared case by case, the report says what differs between the
paired cases, and the verdicts and exit codes are compare's."""

from __future__ import annotations

import subprocess
import sys

import pytest

from locations import ROOT
from runner_fakes import FakeRun
from topk_bench.errors import BadInput
from topk_bench.report import pairing
from topk_bench.report.compare import compare_frames, load

SUITE = """
name = "ab"
workload = "mha"
causal = true
repeats = 7
[shape]
d_model = 8
heads = 2
[sweep]
seq_len = [16, 32]
[[impl]]
name = "vanilla"
[[impl]]
name = "qchunk"
chunk_size = 8
"""


class Slower(FakeRun):
    """qchunk's times scaled by ``factor``: what a bigger chunk did."""

    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def __call__(self, case, budget):
        m = super().__call__(case, budget)
        if case.impl == "qchunk":
            m.times_s = [t * self.factor for t in (0.010, 0.011, 0.012, 0.010, 0.011, 0.012, 0.011)]
            m.peak_bytes = int(m.peak_bytes * (2 if self.factor > 1 else 1))
        else:
            m.times_s = [0.010, 0.011, 0.012, 0.010, 0.011, 0.012, 0.011]
        return m


@pytest.fixture
def runs(cli, tmp_path):
    """BASE with chunk_size 8, NEW with chunk_size 16 whose qchunk cases are twice as slow and large."""
    suite = tmp_path / "ab.toml"
    suite.write_text(SUITE)
    cli.fake = Slower(1.0)
    assert cli("run", suite, "--device", "cpu", "--out", tmp_path / "base", "-q").code == 0
    cli.fake = Slower(2.0)
    assert cli("run", suite, "--device", "cpu", "--out", tmp_path / "new", "-q", "--set", "chunk_size=16").code == 0
    return tmp_path / "base", tmp_path / "new"


def test_without_pairing_nothing_of_qchunk_is_compared(cli, runs):
    result = cli("compare", *runs)
    assert result.code == 1 and "2 new, 2 missing" in result.out


def test_paired_by_impl_and_seq_len_each_case_is_judged_and_the_difference_said(cli, runs):
    result = cli("compare", *runs, "--pair-by", "impl,seq_len")
    text = " ".join(result.out.split())  # the table folds long cells
    assert result.code == 1, result.out  # the qchunk cases regressed: compare's gate
    assert "paired by impl, seq_len (and device, method): 2 pair(s): chunk_size 8 -> 16; 2 pair(s): same" in text
    assert "REGRESSION: 4 case(s) compared: 2 regression" in text and "0 new, 0 missing" in text
    assert "(×2.000)" in text  # the per-case ratio of the peak
    assert "(chunk_size 8 -> 16)" in text  # in the name of each pair that differs


def test_a_pairing_that_improves_passes(cli, runs):
    base, new = runs
    result = cli("compare", new, base, "--pair-by", "impl,seq_len")
    assert result.code == 0 and "no regression" in result.out and "chunk_size 16 -> 8" in " ".join(result.out.split())


def test_a_key_that_is_not_unique_or_not_a_column_is_one_line_of_bad_input(cli, runs):
    line = cli("compare", *runs, "--pair-by", "impl").error_line
    assert line == (
        "topk-bench: error: --pair-by: 2 cases of BASE have impl=vanilla, cpu, measured (they differ in seq_len: "
        "name it too)"
    )
    line = cli("compare", *runs, "--pair-by", "impl,seqlen").error_line
    assert "--pair-by: unknown column 'seqlen'; did you mean 'seq_len'?" in line


def test_pairing_on_frames_keeps_every_row_and_its_case_id(runs):
    base, new = (load(p) for p in runs)
    paired = pairing.pair(base, new, ["impl", "seq_len"])
    assert len(paired.base) == len(base) and set(paired.new["case_id"]) == set(new["case_id"])
    result = compare_frames(base, new, pair_by=["impl", "seq_len"])
    assert {c.case_id for c in result.cases} == set(new["case_id"])
    with pytest.raises(BadInput, match="no case of NEW pairs with one of BASE by mode"):
        compare_frames(base, new.assign(mode="fwd"), pair_by=["mode", "impl", "seq_len"])


def test_through_the_real_command_line(runs):
    done = subprocess.run(
        [sys.executable, "-m", "topk_bench", "compare", *map(str, runs), "--pair-by", "impl,seq_len"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 1 and "REGRESSION" in done.stdout, done.stdout + done.stderr


def test_paired_cases_judged_relative_to_an_implementation_of_their_own_side(runs):
    """--pair-by with --relative-to: each side's reference rows are found within that side after the pairing;
    qchunk twice as slow against vanilla is a regression of its relative time, vanilla itself has none."""
    base, new = (load(p) for p in runs)
    result = compare_frames(base, new, pair_by=["impl", "seq_len"], relative_to="vanilla")
    judged = {c.name: c.metric("time_vs_vanilla") for c in result.cases}
    chunked = {name: m for name, m in judged.items() if "(chunk_size 8 -> 16)" in name}
    assert len(chunked) == 2 and all(m is not None and m.ratio == pytest.approx(2.0) for m in chunked.values())
    assert all(m is None for name, m in judged.items() if name not in chunked)
    assert result.exit_code == 1 and result.relative_to == "vanilla" and result.pairing
