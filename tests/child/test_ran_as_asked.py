"""The child says what it measured with, and a row that ran otherwise than its case asked is ``not_as_asked``.

Each branch is taken for real on the CPU (``execute``, what the child runs, in this process): a timer the device
cannot apply (graph replays asked of the CPU), a compilation that makes no graph (a plug-in attention
torch.compile cannot compile), a plug-in whose code path changes between the parent's plan and the child's run.
The columns are what the backend found, so the test of each reads the row, not the case.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from topk_bench.attention.shared import decode
from topk_bench.case import Budget, Case, Measurement
from topk_bench.child.as_asked import differences
from topk_bench.child.execute import execute
from topk_bench.results import columns as col
from topk_bench.results.row import make_row
from topk_bench.run.plan import expecting_code_paths
from topk_bench.status import Status
from topk_bench.types import DType, Timer

PLUGIN = str(Path(__file__).parents[1] / "plugins" / "not_as_asked_impls.py")


def tiny(impl: str = "vanilla", **fields) -> Case:
    base = dict(suite="t", workload="mha", impl=impl, params={"seq_len": 8, "d_model": 8, "heads": 2}, repeats=2)
    return Case.make(**{**base, **fields})


@pytest.fixture
def eager_compile(monkeypatch):
    """torch.compile with dynamo's ``eager`` backend: the graphs are made as with inductor, in milliseconds."""
    real = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, mode=None: real(self, backend="eager"))


def test_a_case_run_as_asked_is_ok_and_its_row_says_what_ran(single_thread):
    result = execute(tiny(dtype=DType.FLOAT64))
    assert result.status == Status.OK, result.error
    row = make_row(tiny(dtype=DType.FLOAT64), result)
    assert row[col.TIMER] is Timer.PERF_COUNTER and row[col.GRAPH_REPLAYS] == 0
    assert row[col.RAN_DTYPE] == "float64" and row[col.COMPILED] is None
    assert row[col.THREADS] == torch.get_num_threads() and row[col.CODE_PATH] == ""


def test_graph_replays_asked_of_the_cpu_are_timed_eagerly_and_the_row_says_so(single_thread):
    result = execute(tiny(timer=Timer.CUDAGRAPH))
    assert result.status == Status.NOT_AS_ASKED
    assert result.error == "not as asked: timer cudagraph asked, perf_counter ran (this device captures no CUDA graph)"
    assert result.extra[col.TIMER] is Timer.PERF_COUNTER and result.extra[col.GRAPH_REPLAYS] == 0
    assert len(result.times_s) == 2 and result.peak_bytes  # the numbers stay: they are what ran


def test_a_compiled_case_whose_attention_ran_eagerly_is_not_as_asked(single_thread, eager_compile):
    compiled = execute(tiny("vanilla", compile=True))
    assert compiled.status == Status.OK, compiled.error
    assert compiled.extra[col.COMPILED] is True
    eager = execute(tiny("test_eager_only", compile=True, plugins=(PLUGIN,)))
    assert eager.status == Status.NOT_AS_ASKED
    assert eager.extra[col.COMPILED] is False
    assert "compile asked, the attention ran eagerly (torch.compile made no graph of it)" in eager.error


def test_a_plugin_whose_code_path_changes_between_parent_and_child_is_not_as_asked(single_thread, monkeypatch):
    from topk_bench import plugins

    monkeypatch.setattr(decode, "DECODE_TILE_BYTES", 2 << 20)
    plugins.load((PLUGIN,))  # the parent imports a run's plug-ins to plan it
    (case,) = expecting_code_paths([tiny("test_moving_path", plugins=(PLUGIN,))])
    assert case.code_path == "decode_tiles=2MiB"
    result = execute(case)
    assert result.status == Status.NOT_AS_ASKED
    assert result.metadata[col.CODE_PATH] == "decode_tiles=4MiB"
    assert result.error == "not as asked: code_path decode_tiles=2MiB expected, decode_tiles=4MiB ran"


@pytest.mark.parametrize(
    ("asked", "ran", "said"),
    [
        ({"dtype": DType.BFLOAT16}, {col.RAN_DTYPE: "float32"}, "dtype bfloat16 asked, float32 ran"),
        ({"threads": 4}, {col.THREADS: 1}, "4 threads asked, 1 ran"),
        ({"timer": Timer.CUDAGRAPH, "device": "cuda"}, {col.TIMER: Timer.EVENTS}, "timer cudagraph asked, events ran"),
        ({"compile": True}, {col.COMPILED: False}, "compile asked, the attention ran eagerly"),
        ({"code_path": "native_kernels=built:x"}, {col.CODE_PATH: ""}, "code_path native_kernels=built:x expected"),
    ],
)
def test_each_difference_is_named(asked, ran, said):
    found = differences(tiny(**asked), Measurement(status=Status.OK, extra=ran))
    assert len(found) == 1 and found[0].startswith(said)
    # What ran as asked, or was not reported, is no difference.
    assert differences(tiny(**asked), Measurement(status=Status.OK)) == []


def test_a_prediction_is_never_judged_on_what_it_did_not_run():
    case = tiny(method="predicted", timer=Timer.CUDAGRAPH, threads=4)
    assert differences(case, Measurement(status=Status.OK, extra={col.TIMER: Timer.EVENTS, col.THREADS: 1})) == []


def test_a_case_that_failed_keeps_its_own_status(single_thread):
    result = execute(replace(tiny(timer=Timer.CUDAGRAPH), impl="no_such_impl"), Budget())
    assert result.status not in (Status.OK, Status.NOT_AS_ASKED)


def test_resume_keeps_a_not_as_asked_row_and_compare_calls_it_a_regression():
    """As a nonfinite row: it ran and keeps its numbers, so a resume does not run it again; it is not ok."""
    from topk_bench.report.compare import CaseComparison, Verdict
    from topk_bench.run.resume import what_runs

    case = tiny()
    resumed = what_runs([case], [{col.CASE_ID: case.case_id, col.STATUS: "not_as_asked"}], Budget(), ["seq_len"])
    assert resumed.todo == [] and resumed.stoppers == []
    assert CaseComparison(case.case_id, "v", "cpu", "measured", "ok", "not_as_asked").verdict is Verdict.REGRESSION
    assert CaseComparison(case.case_id, "v", "cpu", "measured", "not_as_asked", "ok").verdict is Verdict.IMPROVEMENT


@pytest.mark.slow
def test_a_real_child_writes_what_it_ran_and_not_as_asked_into_the_csv(tmp_path):
    """Through the launcher: the case crosses to the child as JSON, the row comes back with the child's columns."""
    import shutil
    import subprocess
    import sys

    import pandas as pd

    shutil.copy(PLUGIN, tmp_path / "not_as_asked_impls.py")
    suite = tmp_path / "rows.toml"
    suite.write_text(
        'name = "rows"\nworkload = "mha"\nrepeats = 2\nwarmup = 1\nplugins = ["not_as_asked_impls.py"]\n'
        "[shape]\nd_model = 16\nheads = 2\n[sweep]\nseq_len = [16]\n"
        '[[impl]]\nname = "vanilla"\n[[impl]]\nname = "test_eager_only"\ncompile = true\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "topk_bench", "run", str(suite), "--out", str(tmp_path / "out"), "--threads", "1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    rows = pd.read_csv(tmp_path / "out" / "rows.csv").set_index(col.IMPL)
    assert list(rows[col.STATUS]) == ["ok", "not_as_asked"], done.stderr[-2000:]
    assert set(rows[col.TIMER]) == {"perf_counter"} and set(rows[col.GRAPH_REPLAYS]) == {0}
    assert set(rows[col.RAN_DTYPE]) == {"float32"} and set(rows[col.THREADS]) == {1}
    assert rows.loc["test_eager_only", col.COMPILED] == False  # noqa: E712 -- a CSV cell read back as a bool
    assert "compile asked, the attention ran eagerly" in rows.loc["test_eager_only", col.ERROR]
