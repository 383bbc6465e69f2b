"""``run --remeasure contended,busy,noisy`` (issue 29): exactly the flagged rows run again, their old rows (and
samples) kept in OUT/history/<suite>.csv, every other row as it was."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runner_fakes import write_suite
from topk_bench.case import Budget, Case, Measurement
from topk_bench.errors import BadInput
from topk_bench.results.store import read, read_rows
from topk_bench.run import runner
from topk_bench.run.executors import LocalExecutor
from topk_bench.run.resolve import Flags

QUIET = {"cpu_wait": 0.01, "cpu_share": 0.97, "runnable": 0.5, "load_start": 0.2, "load_end": 0.2}


class Scripted:
    """A stand-in for ``run_isolated``: per case (impl, seq_len), the readings its child reports."""

    def __init__(self, readings: dict[tuple[str, int], dict] | None = None, noisy: set | frozenset = frozenset()):
        self.readings, self.noisy = readings or {}, noisy
        self.ran: list[Case] = []

    def __call__(self, case: Case, budget: Budget) -> Measurement:
        self.ran.append(case)
        key = (case.impl, case.param_dict["seq_len"])
        times = [0.001, 0.002, 0.004] if key in self.noisy else [0.001, 0.001, 0.001]
        return Measurement(
            status="ok",
            peak_bytes=1000,
            baseline_bytes=100,
            times_s=times,
            device_name="fake cpu",
            metadata={"torch_version": "fake", "git_sha": "abc", **QUIET, **self.readings.get(key, {})},
        )


def _run(tmp_path, fake, resume=True, **flags):
    return runner.run(
        write_suite(tmp_path),
        Flags(out=tmp_path / "out", device="cpu", **flags),
        progress=False,
        resume=resume,
        executor_obj=LocalExecutor(run=fake),
    )


def _trust(csv) -> dict[tuple[str, str], str]:
    return {(r["impl"], r["seq_len"]): r["trust"] for r in read_rows(csv)}


def test_remeasure_runs_exactly_the_flagged_rows_and_keeps_their_old_rows_in_the_history(tmp_path):
    first = Scripted(
        {
            ("vanilla", 16): {"cpu_wait": 0.7, "cpu_share": 0.3},  # contended
            ("qchunk", 64): {"runnable": 2.5},
        },  # busy
        noisy={("vanilla", 128)},
    )
    result = _run(tmp_path, first)
    before = _trust(result.csv_path)
    assert before[("vanilla", "16")] == "contended" and before[("qchunk", "64")] == "busy"
    assert before[("vanilla", "128")] == "noisy" and sum(v == "" for v in before.values()) == 5
    old_rows = {r["case_id"]: r for r in read_rows(result.csv_path)}

    again = Scripted()  # a quiet machine now
    result = _run(tmp_path, again, remeasure="contended,busy")
    assert sorted((c.impl, c.param_dict["seq_len"]) for c in again.ran) == [("qchunk", 64), ("vanilla", 16)]
    after = _trust(result.csv_path)
    assert len(after) == 8 and after[("vanilla", "16")] == "" and after[("qchunk", "64")] == ""
    assert after[("vanilla", "128")] == "noisy"  # not asked for: kept
    remeasured = {c.case_id for c in again.ran}
    new_rows = {r["case_id"]: r for r in read_rows(result.csv_path)}
    assert all(new_rows[i] == row for i, row in old_rows.items() if i not in remeasured)  # the rest as they were
    history = runner.history_path(result.csv_path)
    assert history == tmp_path / "out" / "history" / "fake.csv"
    old = {(r["impl"], r["seq_len"]): r for r in read(history).rows}
    assert old.keys() == {("vanilla", "16"), ("qchunk", "64")}
    assert old[("vanilla", "16")]["trust"] == "contended" and old[("vanilla", "16")]["cpu_wait"] == "0.7"
    assert old[("vanilla", "16")]["times_s"] == "0.001;0.001;0.001"  # the old samples, in the history only

    third = Scripted()
    _run(tmp_path, third, remeasure="noisy")
    assert [(c.impl, c.param_dict["seq_len"]) for c in third.ran] == [("vanilla", 128)]
    assert len(read(history).rows) == 3
    fourth = Scripted()
    _run(tmp_path, fourth, remeasure="contended,busy,noisy")
    assert fourth.ran == []  # nothing flagged is left


def test_remeasure_runs_no_case_without_a_row_and_says_how_to_complete_the_suite(tmp_path):
    result = _run(tmp_path, Scripted({("vanilla", 16): {"cpu_wait": 0.9}}))
    lines = result.csv_path.read_text().splitlines()
    result.csv_path.write_text("\n".join(lines[:-2]) + "\n")  # two cases lost their rows
    fake = Scripted()
    result = _run(tmp_path, fake, remeasure="contended")
    assert [(c.impl, c.param_dict["seq_len"]) for c in fake.ran] == [("vanilla", 16)]
    assert any("2 case(s) without a row were not run" in n for n in result.notes)


@pytest.mark.parametrize("value", ["", "slow", "contended,fast", ","])
def test_remeasure_takes_only_trust_flags(tmp_path, value):
    with pytest.raises(BadInput) as caught:
        _run(tmp_path, Scripted(), remeasure=value)
    assert caught.value.key == "--remeasure" and "contended, noisy" in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_remeasure_and_no_resume_contradict_each_other(tmp_path):
    with pytest.raises(BadInput, match="choose one"):
        _run(tmp_path, Scripted(), remeasure="busy", resume=False)


def test_remeasure_on_the_command_line(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "topk_bench",
            "run",
            str(write_suite(tmp_path)),
            "--out",
            str(tmp_path / "out"),
            "--remeasure",
            "cotended",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "topk-bench: error: --remeasure: expected trust flags among busy, contended, noisy, comma-separated, "
        "got 'cotended'"
    ]


def test_while_remeasuring_the_old_rows_stay_in_the_csv_and_are_already_in_the_history(tmp_path):
    """Killed mid-way, a --remeasure loses no row: each old row stays until its case has a new one (main's
    rule for every row measured again), and it is in the history before its case runs."""
    result = _run(tmp_path, Scripted({("vanilla", 16): {"cpu_wait": 0.7}, ("qchunk", 64): {"cpu_wait": 0.8}}))
    csv, history = result.csv_path, runner.history_path(result.csv_path)
    seen = []

    class Watching(Scripted):
        def __call__(self, case, budget):
            in_csv = [r["case_id"] for r in read_rows(csv)]
            in_history = [r["case_id"] for r in read(history).rows]
            seen.append((in_csv.count(case.case_id), in_history.count(case.case_id)))
            return super().__call__(case, budget)

    _run(tmp_path, Watching(), remeasure="contended")
    assert seen == [(1, 1), (1, 1)]  # each case's old row in both files while it ran
    assert len(read_rows(csv)) == 8 and len(read(history).rows) == 2  # afterwards: one row per case
