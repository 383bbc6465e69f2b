"""``topk-bench gate --judge BASE NEW``: runs already made, judged as the gate's last look judges them (fast). The
committed runs of tests/data/ci-time/: BASE's lines the reader leaves out."""

from __future__ import annotations

import csv
import io

import pytest

from locations import TESTS
from topk_bench.cli import main

DATA = TESTS / "data" / "ci-time"


def gate(capsys, *args) -> tuple[int, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        main(["gate", "--judge", *map(str, args)])
    return int(ended.value.code), " ".join(capsys.readouterr().out.split())


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
