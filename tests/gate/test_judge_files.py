"""``topk-bench gate --judge BASE NEW``: runs already made, judged as the gate's last look judges them (fast). The
committed runs of tests/data/ci-time/ (its README): the demonstration beside two busy loops, unchanged code and a
1.3x slowdown, three gates each; and BASE's lines the reader leaves out."""

from __future__ import annotations

import csv
import io

import pandas as pd
import pytest

from locations import TESTS
from topk_bench import load_results
from topk_bench.cli import main

DATA = TESTS / "data" / "ci-time"


def gate(capsys, *args) -> tuple[int, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        main(["gate", "--judge", *map(str, args)])
    return int(ended.value.code), " ".join(capsys.readouterr().out.split())


# The gate's demonstration (docs/regression.md, "The CPU time gate"): three gates of unchanged code and three of
# topk_fast slowed 1.3x by the hook, each beside two busy loops (load 3 on two cores), every block's rows kept.
BUSY = DATA / "busy-loops"


def rows_of(run) -> pd.DataFrame:
    return pd.concat([load_results(csv) for csv in sorted(run.rglob("*.csv"))], ignore_index=True)


@pytest.mark.parametrize("run", ["unchanged-1", "unchanged-2", "unchanged-3"])
def test_unchanged_code_beside_two_busy_loops_passes_with_every_row_flagged_busy(capsys, run):
    rows = rows_of(BUSY / run)
    assert len(rows) >= 40 and all("busy" in str(t) for t in rows["trust"])  # 4 blocks a side a look, 5 cases
    # The noisy case of the failing runs: sink_window's step, 1 to 2 ms (a seventh of topk_fast's)
    sinks = rows[rows["impl"] == "sink_window"]["time_median_s"]
    assert sinks.between(0.5e-3, 3e-3).all()
    code, out = gate(capsys, BUSY / run / "BASE", BUSY / run / "NEW")
    assert code == 0 and "passed: 5 case(s) judged in" in out and "5 unchanged" in out


@pytest.mark.parametrize("run", ["slowed-1", "slowed-2", "slowed-3"])
def test_a_1_3x_slowdown_beside_two_busy_loops_fails_naming_the_two_slowed_cases(capsys, run):
    code, out = gate(capsys, BUSY / run / "BASE", BUSY / run / "NEW")
    assert code == 1 and "FAILED: 3 unchanged, 2 regressed" in out, out
    assert "decode/Top-k fast (topk=1024): regressed beyond x1.2" in out
    assert "mha/Top-k fast (size=512, topk=64): regressed beyond x1.2" in out


def with_a_line_the_reader_leaves_out(tmp_path):
    """base.csv with a second line of one case whose status no reader knows: the reader keeps the case's valid
    line and leaves that one out, saying so."""
    lines = (DATA / "base.csv").read_text().splitlines()
    row = next(csv.reader([lines[3]]))
    row[lines[0].split(",").index("status")] = "bogus"
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow(row)
    path = tmp_path / "base.csv"
    path.write_text("\n".join([*lines[:4], out.getvalue().strip(), *lines[4:]]) + "\n")
    return path


def test_a_line_of_base_the_reader_left_out_fails_the_gate(capsys, tmp_path):
    # The old gate gave BASE's frame NEW's attributes, so BASE's left-out lines were never seen: it passed this.
    code, out = gate(capsys, with_a_line_the_reader_leaves_out(tmp_path), DATA / "run.csv")
    assert code == 1 and "FAILED: cannot judge every case: BASE left out base.csv line 5: unknown status 'bogus'" in out


def test_each_side_is_judged_by_its_own_lines(capsys, tmp_path):
    code, out = gate(capsys, DATA / "base.csv", with_a_line_the_reader_leaves_out(tmp_path))
    assert code == 1 and "NEW left out base.csv line 5" in out and "BASE left out" not in out
