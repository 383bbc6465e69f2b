"""A profile never costs a measurement, and ``profile`` says what it will do before it does it.

- ``run --profile`` where the profiles cannot be written (a file named ``profile`` in OUT): every row stays
  ``ok``, its error says that its profile is missing, a warning says so first, and a resume has nothing to run;
- ``profile --out`` that cannot hold the profiles (/proc, a file, a file where ``DIR/<case_id>`` belongs): one
  line, exit 2, before any case runs;
- ``profile`` of more cases than ``max_cases`` needs ``--yes``; it says how many cases and how long first,
  prints each case as it ends, and an interrupted ``profile`` says how far it got.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from faults import tiny_suite
from topk_bench.capture.sources import PROJECT_ROOT
from topk_bench.cli import main
from topk_bench.run import launcher
from topk_bench.run.plan import plan
from topk_bench.run.resolve import Flags

pytestmark = pytest.mark.usefixtures("single_thread")


def _topk_bench(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "100"}
    return subprocess.run(
        [sys.executable, "-m", "topk_bench", *map(str, args)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def _main(*args) -> int | str:
    """``topk-bench ARGS`` in this process: its exit code, or "KeyboardInterrupt" when that escaped it."""
    try:
        main([str(a) for a in args])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except KeyboardInterrupt:
        return "KeyboardInterrupt"
    return 0


def test_run_profile_where_no_profile_can_be_written_keeps_every_measurement(tmp_path):
    suite = tiny_suite(tmp_path, sizes=(16, 32))
    out = tmp_path / "out"
    out.mkdir()
    (out / "profile").write_text("a file where the profiles' directory belongs\n")
    result = _topk_bench("run", suite, "--predict", "--out", out, "--profile")
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stderr.split())  # rich folds lines at the width
    assert "profile: profiles cannot be written there (a file, not a directory)" in said
    rows = list(csv.DictReader(open(out / "tiny.csv")))
    assert [r["status"] for r in rows] == ["ok", "ok"], rows
    assert all("profile not written" in r["error"] for r in rows) and all(r["peak_bytes"] for r in rows)
    again = _topk_bench("run", suite, "--predict", "--out", out)
    assert again.returncode == 0 and "nothing to run" in " ".join((again.stdout + again.stderr).split()), again
    assert [r["status"] for r in csv.DictReader(open(out / "tiny.csv"))] == ["ok", "ok"]


@pytest.mark.parametrize("place", ["proc", "a file", "a file where a case goes"])
def test_profile_out_is_checked_before_any_case_runs(monkeypatch, capsys, tmp_path, place):
    ran = []
    monkeypatch.setattr(launcher, "run_isolated", lambda case, budget: ran.append(case))
    suite = tiny_suite(tmp_path, sizes=(16,))
    out = Path("/proc/topk-bench-profiles") if place == "proc" else tmp_path / "profiles"
    if place == "a file":
        out.write_text("")
    elif place == "a file where a case goes":
        out.mkdir()
        case_id = plan(suite, Flags(predict=True, out=tmp_path), yes=True).cases[0].case_id
        (out / case_id).write_text("")
    code = _main("profile", suite, "--case", "impl=vanilla", "--predict", "--out", out)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("topk-bench: error: ") and "--out" in lines[0], err
    assert not ran


def test_more_cases_than_max_cases_need_yes(monkeypatch, capsys, tmp_path):
    ran = []
    monkeypatch.setattr(launcher, "run_isolated", lambda case, budget: ran.append(case))
    suite = tiny_suite(tmp_path, sizes=(16, 32, 64), extra="max_cases = 2")
    code = _main("profile", suite, "--case", "impl=vanilla", "--predict", "--out", tmp_path / "p")
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "3 cases to profile" in err and "max_cases = 2" in err and "--yes" in err
    assert not ran and not (tmp_path / "p").exists()


def test_profile_says_what_it_will_do_and_each_case_as_it_ends_and_when_interrupted(monkeypatch, capsys, tmp_path):
    real, calls = launcher.run_isolated, []

    def second_interrupted(case, budget):
        calls.append(case)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(case, budget)

    monkeypatch.setattr(launcher, "run_isolated", second_interrupted)
    suite = tiny_suite(tmp_path, sizes=(16, 32, 64), extra="max_cases = 2")
    code = _main("profile", suite, "--case", "impl=vanilla", "--predict", "--out", tmp_path / "p", "--yes")
    out, err = capsys.readouterr()
    assert code == 130, err
    assert err.splitlines()[0].startswith("topk-bench: 3 cases to profile into ") and "one at a time" in err
    assert "vanilla at seq_len=16" in out  # the first case, told as it ended
    assert "interrupted: 1 case(s) profiled" in err and "Traceback" not in err
    (profiled,) = (tmp_path / "p").iterdir()  # the first case's profile; the second wrote none
    assert (profiled / "profile.json").is_file()


def test_rounds_past_the_bound_need_yes_and_a_run_with_rounds_says_each(cli, tmp_path):
    suite = tiny_suite(tmp_path, sizes=(16,))
    refused = cli("run", suite, "--out", tmp_path / "out", "--rounds", "100000000")
    assert refused.code == 2 and "--rounds" in refused.error_line and "--yes" in refused.error_line
    assert not (tmp_path / "out").exists()
    done = cli("run", suite, "--out", tmp_path / "out", "--rounds", "3")
    assert done.code == 0, done.err
    said = done.out + done.err
    assert "round 1 of 3 done" in said and "round 2 of 3 done" in said and "round 3 of 3 done" in said
