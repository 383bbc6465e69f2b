"""The ``threads`` setting (issue 29): bench.toml < suite < ``--threads``; ``auto``; the child runs with it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from topk_bench import machine
from topk_bench.errors import BadInput
from topk_bench.results.store import read_rows
from topk_bench.run import runner
from topk_bench.run.resolve import Flags

SUITE = """
name = "threads"
workload = "mha"
repeats = 2
warmup = 0
{threads}
[shape]
d_model = 8
heads = 2
[sweep]
seq_len = [16]
[[impl]]
name = "vanilla"
"""


def _files(tmp_path: Path, suite_threads: str = "", bench_threads: str = "") -> tuple[Path, Path]:
    suite = tmp_path / "threads.toml"
    suite.write_text(SUITE.format(threads=suite_threads))
    config = tmp_path / "bench.toml"
    config.write_text(bench_threads + "\n")
    return suite, config


@pytest.mark.parametrize(
    "bench, suite, flag, expected",
    [
        ("threads = 3", "", None, 3),
        ("threads = 3", "threads = 2", None, 2),
        ("threads = 3", "threads = 2", "5", 5),
        ("", "threads = 4", 1, 1),
    ],
)
def test_threads_resolve_bench_toml_then_suite_then_flag(tmp_path, bench, suite, flag, expected):
    suite_path, config = _files(tmp_path, suite, bench)
    plan = runner.plan(suite_path, Flags(out=tmp_path / "out", device="cpu", threads=flag), config=config)
    assert plan.settings.threads == expected
    assert {case.threads for case in plan.cases} == {expected}


def test_auto_is_the_cores_other_processes_leave_free_and_says_so(tmp_path):
    suite, config = _files(tmp_path)  # bench.toml without threads: auto
    plan = runner.plan(suite, Flags(out=tmp_path / "out", device="cpu"), config=config)
    assert 1 <= plan.settings.threads <= machine.cores()
    note = next(n for n in plan.notes if n.startswith("threads = auto"))
    assert f"{plan.settings.threads} per case" in note and "cores kept busy by other processes" in note


def test_a_prediction_runs_on_one_thread_and_a_slurm_auto_on_its_cpus(tmp_path):
    suite, config = _files(tmp_path, "threads = 2")
    assert runner.plan(suite, Flags(out=tmp_path / "o", predict=True), config=config).settings.threads == 1
    config.write_text('threads = "auto"\n[executor]\nkind = "slurm"\ncpus_per_task = 3\n')
    suite.write_text(SUITE.format(threads=""))
    plan = runner.plan(suite, Flags(out=tmp_path / "o", device="cpu"), config=config)
    assert plan.settings.threads == 3 and any("cpus_per_task" in n for n in plan.notes)


@pytest.mark.parametrize(
    "where, text, key",
    [
        ("flag", "0", "--threads"),
        ("flag", "many", "--threads"),
        ("flag", "100000", "--threads"),  # as --jobs 100000: one bound (suite/values.py) for the flag and the keys
        ("suite", "threads = 100000", "threads"),
        ("suite", "threads = 0", "threads"),
        ("suite", 'threads = "many"', "threads"),
        ("bench", "threads = -1", "threads"),
    ],
)
def test_a_thread_setting_that_is_not_a_count_or_auto_is_bad_input(tmp_path, where, text, key):
    suite, config = _files(tmp_path, text if where == "suite" else "", text if where == "bench" else "")
    with pytest.raises(BadInput) as caught:
        runner.plan(
            suite, Flags(out=tmp_path / "out", device="cpu", threads=text if where == "flag" else None), config=config
        )
    assert caught.value.key == key or key in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_threads_flag_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    suite, config = _files(tmp_path)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "topk_bench",
            "run",
            str(suite),
            "--config",
            str(config),
            "--out",
            str(tmp_path / "out"),
            "--threads",
            "0",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        'topk-bench: error: --threads: expected a number from 1 to 1024 or "auto", got 0'
    ]


@pytest.mark.slow
def test_the_child_runs_with_the_threads_asked_and_the_row_records_them(tmp_path):
    suite, config = _files(tmp_path)
    for threads in (1, 2):
        result = runner.run(
            suite,
            Flags(out=tmp_path / str(threads), device="cpu", threads=threads, max_case_seconds=120),
            config=config,
            progress=False,
        )
        (row,) = read_rows(result.csv_path)
        assert row["status"] == "ok", row["error"]
        assert row["threads"] == str(threads)  # torch.get_num_threads() in the child that measured
