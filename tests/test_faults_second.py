"""The second red team's findings (issue 29): one test per finding, each failing before its fix.

Real files, real processes and real signals where the finding is about them; the
scripted executor (:class:`runner_fakes.FakeRun`) where only the harness's own
logic is on trial.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from faults import Cli, tiny_suite
from topk_bench.run.resolve import Flags

PLUGINS = Path(__file__).parent / "plugins"


@pytest.fixture
def cli(monkeypatch, capsys):
    return Cli(monkeypatch, capsys)


@pytest.fixture
def measured(tmp_path, cli):
    """A results CSV written by `run` of the tiny suite (3 ok cases, the scripted executor)."""
    suite = tiny_suite(tmp_path, sizes=(16, 32, 64))
    out = tmp_path / "out"
    assert cli("run", suite, "--out", out, "-q").code == 0
    return out / "tiny.csv"


def _rewritten(csv_path: Path, target: Path, **columns) -> Path:
    """A copy of the results CSV with every row's ``columns`` set (a value, or a list: one per row)."""
    frame = pd.read_csv(csv_path, dtype=str, keep_default_na=False)
    for column, value in columns.items():
        frame[column] = value
    target.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(target, index=False)
    return target


# --- compare never passes on nothing comparable --------------------------------------------------------

FAILED = {"peak_bytes": "", "baseline_bytes": "", "times_s": "", "time_median_s": "", "time_iqr_s": "",
          "time_mean_s": "", "time_min_s": "", "repeats": "0", "trust": "", "time_cv": ""}


@pytest.mark.parametrize("base_status,new_status", [("error", "error"), ("error", "crashed"),
                                                    ("unsupported", "skipped")])
def test_compare_fails_when_every_case_failed_on_a_side(measured, cli, tmp_path, base_status, new_status):
    base = _rewritten(measured, tmp_path / "base" / "tiny.csv", status=base_status, **FAILED)
    new = _rewritten(measured, tmp_path / "new" / "tiny.csv", status=new_status, **FAILED)
    result = cli("compare", base.parent, new.parent)
    assert result.code == 1, result.out
    assert "nothing compared" in result.out and "no regression" not in result.out, result.out


def test_compare_fails_when_new_ok_rows_have_no_peak_and_no_samples(measured, cli, tmp_path):
    new = _rewritten(measured, tmp_path / "new" / "tiny.csv", **{k: v for k, v in FAILED.items() if k != "repeats"})
    result = cli("compare", measured, new)
    assert result.code == 1, result.out
    assert "invalid" in result.out and "no regression" not in result.out, result.out
    assert "peak_bytes" in result.out and "NEW has none" in result.out, result.out


def test_compare_judges_the_cases_that_compare_beside_a_failure_that_changed_kind(measured, cli, tmp_path):
    """One case went from error to crashed while the others were measured on both sides: the gate judges the
    others (the rule above is about nothing comparable, not about any failed case)."""
    base = _rewritten(measured, tmp_path / "base.csv", status=["error", "ok", "ok"])
    new = _rewritten(measured, tmp_path / "new.csv", status=["crashed", "ok", "ok"])
    result = cli("compare", base, new)
    assert result.code == 0 and "error → crashed" in result.out, result.out


# --- two [[impl]] entries that differ only in their label ---------------------------------------------

def test_two_entries_that_differ_only_in_label_are_bad_input(tmp_path, cli):
    """They would share every case_id: compare of a folder with itself failed forever, show printed one."""
    suite = tiny_suite(tmp_path, impl_extra='label = "A"\n[[impl]]\nname = "vanilla"\nlabel = "B"')
    result = cli("run", suite, "--out", tmp_path / "out")
    line = result.error_line
    assert result.code == 2 and str(suite) in line and "impl[1] (vanilla)" in line, line
    assert "impl[0]" in line and "label" in line, line
    assert not (tmp_path / "out").exists()


def test_entries_that_differ_in_an_option_keep_their_case_ids(tmp_path, cli):
    """The committed CI baseline keys by case_id: a suite without duplicates keeps its ids."""
    from topk_bench.run.plan import plan

    base = Path(__file__).parents[1] / "results" / "baselines" / "ci-predicted.csv"
    planned = plan(Path(__file__).parents[1] / "suites" / "ci.toml", Flags(predict=True, out=tmp_path))
    assert {c.case_id for c in planned.cases} == set(pd.read_csv(base)["case_id"])


# --- a full TMPDIR -------------------------------------------------------------------------------------

def test_a_full_tmpdir_stops_the_run_with_its_reason_and_a_rerun_completes(tmp_path, monkeypatch, capsys):
    """A real 64 KiB tmpfs as TMPDIR, with room for the case file and not the result: the children measure,
    then cannot write their results. No case is to blame: the run stops with one line naming TMPDIR (exit 2)
    and writes no row for it; once there is room again, running again measures them."""
    import tempfile

    from faults import fill, tmpfs
    from topk_bench.results import store
    from topk_bench.run.launcher import run_isolated

    suite = tiny_suite(tmp_path)
    out = tmp_path / "out"
    with tmpfs(tmp_path / "scratch") as scratch:
        filler = fill(scratch, leave_bytes=4096)
        monkeypatch.setattr(tempfile, "tempdir", str(scratch))
        real = Cli(monkeypatch, capsys, fake=run_isolated)  # the real launcher, children and all
        result = real("run", suite, "--out", out)
        line = result.err.strip().splitlines()[-1]  # after the run's first notes
        assert "Traceback" not in result.err and line.startswith("topk-bench: error: "), result.err
        assert result.code == 2 and str(scratch) in line and "No space left on device" in line, line
        assert "TMPDIR" in line and "run again" in line, line
        assert store.read(out / "tiny.csv").rows == []
        filler.unlink()
        again = real("run", suite, "--out", out, "-q")
        assert again.code == 0, again.err
        rows = store.read(out / "tiny.csv").rows
        assert [r["status"] for r in rows] == ["ok", "ok"], rows


# --- flags get the same validation as suite keys -------------------------------------------------------

@pytest.mark.parametrize("flag,value,words", [
    ("--max-memory", "nan", "finite"),
    ("--max-memory", "inf", "finite"),
    ("--max-case-seconds", "inf", "finite"),
    ("--max-case-seconds", "nan", "finite"),
    ("--max-case-seconds", "1e10", "less than or equal to"),
    ("--jobs", "100000", "less than or equal to"),
    ("--warmup-s", "inf", "finite"),
])
def test_a_flag_out_of_range_is_one_line_and_writes_nothing(tmp_path, cli, flag, value, words):
    suite = tiny_suite(tmp_path)
    result = cli("run", suite, "--out", tmp_path / "out", flag, value)
    line = result.error_line
    assert result.code == 2 and line.startswith(f"topk-bench: error: {flag}: ") and words in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["suite", "bench.toml"])
@pytest.mark.parametrize("key,value,words", [
    ("max_memory_gib", "inf", "finite"),
    ("max_memory_gib", "nan", "finite"),
    ("max_case_seconds", "inf", "finite"),
    ("max_case_seconds", "1e10", "less than or equal to"),
    ("warmup_s", "inf", "finite"),
    ("warmup_s", "-1", "greater than or equal to 0"),
])
def test_a_setting_out_of_range_is_one_line_naming_its_file(tmp_path, cli, where, key, value, words):
    config = tmp_path / "bench.toml"
    suite = tiny_suite(tmp_path, extra=f"{key} = {value}" if where == "suite" else "")
    config.write_text(f"{key} = {value}\n" if where == "bench.toml" else "")
    result = cli("run", suite, "--out", tmp_path / "out", "--config", config)
    line = result.error_line
    named = suite if where == "suite" else config
    assert result.code == 2 and f"{named}: {key}: " in line and words in line, line
    assert not (tmp_path / "out").exists()


def test_the_largest_time_budget_allowed_runs_a_real_case(tmp_path):
    """The bound is where the launcher's wait still works: a case under it is measured, not an error row."""
    from topk_bench.case import Budget, Case
    from topk_bench.run.launcher import run_isolated
    from topk_bench.suite.values import MAX_CASE_SECONDS

    case = Case.make(suite="t", workload="mha", impl="vanilla", params={"seq_len": 8, "d_model": 8, "heads": 2},
                     mode="fwd", warmup=0, repeats=1)
    result = run_isolated(case, Budget(max_seconds=MAX_CASE_SECONDS))
    assert result.status == "ok", result.error


# --- a plug-in workload's cost model -------------------------------------------------------------------

TRAFFIC_PLUGIN = """
import math
from topk_bench import workloads

def traffic(case):
    {body}

workloads.register(workloads.WorkloadSpec(
    name="{name}", description="a cost model under test", build=lambda case, device, dtype: None,
    params={{"seq_len": 16, "d_model": 16, "heads": 2, "batch": 1}}, traffic=traffic))
"""


@pytest.mark.parametrize("body,words", [
    ("return workloads.Traffic(flops=math.nan, bytes=1, tokens=1, tokens_per_sequence=1)", "flops"),
    ("return workloads.Traffic(flops=1, bytes=1, tokens=1, tokens_per_sequence=0)", "tokens_per_sequence"),
    ("return 'lots'", "Traffic"),
    ("raise ZeroDivisionError('oops')", "ZeroDivisionError: oops"),
])
def test_a_plugin_workloads_broken_cost_model_is_bad_input_before_any_file(tmp_path, cli, body, words, monkeypatch):
    """NaN traffic wrote rows the reader rejects (resume re-ran them forever); a raising one was a traceback."""
    from topk_bench.workloads import spec

    monkeypatch.setattr(spec, "_REGISTRY", dict(spec._REGISTRY))  # the plug-in's workload goes with the test
    name = f"costly_{abs(hash(body)) % 10**6}"
    (tmp_path / "costly.py").write_text(TRAFFIC_PLUGIN.format(body=body, name=name))
    suite = tiny_suite(tmp_path, extra=f'plugins = ["costly.py"]\nworkload = "{name}"').read_text()
    suite = suite.replace('workload = "mha"\n', "", 1)
    (tmp_path / "tiny.toml").write_text(suite)
    result = cli("run", tmp_path / "tiny.toml", "--out", tmp_path / "out")
    line = result.error_line
    assert result.code == 2 and "tiny.toml: workload: " in line and "traffic" in line and words in line, line
    assert not (tmp_path / "out").exists()


# --- widening the header keeps lines of the older width readable -------------------------------------

def test_widening_the_header_relays_lines_left_out_so_the_next_run_accepts_the_file(measured, cli, tmp_path):
    """Three rows of another version (a status this one does not know) stay in the file; a run whose cases
    need a new column widens the header. Those lines must widen with it (their cells kept, the new ones
    empty): left at the old width they outnumber the whole lines and the next run refused the file as damaged."""
    from topk_bench.results import store

    foreign = _rewritten(measured, measured, status="frobnicated")  # (not "preempted": a status since issue 29 part A)
    before = [line.split(",") for line in foreign.read_text().splitlines()[1:]]
    suite = tiny_suite(tmp_path, sizes=(16,), file="other", impl_extra="", extra="")
    suite.write_text(suite.read_text().replace('name = "vanilla"', 'name = "qchunk"\nchunk_size = 8'))
    out = measured.parent
    assert cli("run", suite, "--out", out, "-q").code == 0
    table = store.read(measured)
    assert "chunk_size" in table.header and table.header_problem() is None, table.header_problem()
    assert len(table.rows) == 1 and len(table.dropped) == 3 and all("frobnicated" in d for d in table.dropped)
    kept = [line.split(",") for line in measured.read_text().splitlines()[1:] if "frobnicated" in line]
    assert [fields[: len(before[0])] for fields in kept] == before  # every cell as it was, new ones empty after
    again = cli("run", suite, "--out", out, "-q")
    assert again.code == 0, again.err


# --- processes a case leaves behind --------------------------------------------------------------------

SPAWNER = '''
import os, subprocess, time
from pathlib import Path
import implementations
from implementations import Implementation

PIDS = Path(__file__).with_suffix(".pids")
RECORD = f"echo $$ >> {PIDS}; exec sleep 300"
started = []


def _daemon():
    """The classic double fork: the daemon's parent exits at once, and it runs in a session of its own."""
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            os.execvp("sh", ["sh", "-c", RECORD])
        os._exit(0)
    os.waitpid(pid, 0)


def spawn(q, k, v, *, causal=False, activation="softmax", hang=0):
    if not started:
        started.append(subprocess.Popen(["sh", "-c", RECORD]))                           # a child
        started.append(subprocess.Popen(["sh", "-c", RECORD], start_new_session=True))   # setsid
        _daemon()
        while len(PIDS.read_text().split()) < 3 if PIDS.exists() else True:
            time.sleep(0.01)
    time.sleep(hang)
    return q.clone()


implementations.register(Implementation("spawner", spawn, "starts processes", options={"hang": 0},
                                        predictable=False))
'''


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.parametrize("hang,named", [(0, 3), (60, 2)], ids=["ends", "timeout"])
def test_processes_a_case_started_are_killed_with_it_and_said_in_its_row(tmp_path, hang, named):
    """A child, a setsid one and a double-forked daemon: none outlives the case, whether it ends (the case's
    process kills all three) or is killed after its time budget (the child dies with the case's process group,
    the template kills the two that left it), and its row names those killed."""
    import os
    import signal

    from topk_bench.case import Budget, Case
    from topk_bench.run.launcher import run_isolated

    plugin = tmp_path / "spawner.py"
    plugin.write_text(SPAWNER)
    case = Case.make(suite="t", workload="mha", impl="spawner", params={"seq_len": 8, "d_model": 8, "heads": 2},
                     options={"hang": hang}, mode="fwd", warmup=0, repeats=1, plugins=(str(plugin),))
    try:
        result = run_isolated(case, Budget(max_seconds=5 if hang else 120))
        pids = [int(p) for p in plugin.with_suffix(".pids").read_text().split()]
        assert len(pids) == 3
        assert result.status == ("timeout" if hang else "ok"), result.error
        assert not [p for p in pids if _alive(p)], "processes outlived their case"
        assert f"killed {named} process(es) the case left running" in result.error and "sleep" in result.error, result.error
    finally:
        for pid in [int(p) for p in plugin.with_suffix(".pids").read_text().split()] if plugin.with_suffix(".pids").exists() else []:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# --- plug-ins that end the process, at import or when called -------------------------------------------

def _topk_bench(*args, timeout=600):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "topk_bench", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "250"})


def test_a_plugin_ending_the_process_at_import_is_one_line_for_run_list_and_doctor(tmp_path):
    """os._exit(0) at import made run, list and doctor exit 0 with no output and no files."""
    plugin = tmp_path / "quits.py"
    plugin.write_text("import os\nos._exit(0)\n")
    suite = tiny_suite(tmp_path, extra='plugins = ["quits.py"]')
    for args in (("run", suite, "--out", tmp_path / "out"), ("list", "--plugins", plugin),
                 ("list", suite), ("doctor", "--plugins", plugin)):
        result = _topk_bench(*args)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and "Traceback" not in result.stderr, (args, result.stderr)
        assert lines[-1].startswith("topk-bench: error: ") and "quits.py" in lines[-1], (args, result.stderr)
        assert "ended the process (exit code 0" in lines[-1], (args, lines[-1])
    assert not (tmp_path / "out").exists()


def test_a_plugin_hanging_at_import_is_bad_input_after_its_time(tmp_path):
    from topk_bench import plugins
    from topk_bench.errors import BadInput

    plugin = tmp_path / "sleeps.py"
    plugin.write_text("import time\ntime.sleep(600)\n")
    with pytest.raises(BadInput, match="did not finish importing within 1 s"):
        plugins.IMPORT_LIMIT_S, saved = 1.0, plugins.IMPORT_LIMIT_S
        try:
            plugins.resolve([str(plugin)], key="--plugins")
        finally:
            plugins.IMPORT_LIMIT_S = saved
    assert "topk_bench_plugin_sleeps" not in " ".join(__import__("sys").modules)  # never imported here


MISBEHAVING = PLUGINS / "misbehaving_impls.py"


def test_the_doctor_judges_a_plugins_implementation_in_a_process_of_its_own():
    """Called in the doctor's process, os._exit(0) ended it with exit 0 and nothing said: now it fails its
    check, by name and with why."""
    from topk_bench.doctor import isolated
    from topk_bench.doctor.check import Result

    [check] = isolated.checks(["test_os_exit"], "cpu", (str(MISBEHAVING),))
    assert check.name == "agreement: test_os_exit" and check.result is Result.FAIL, check
    assert "ended (exit code 0)" in check.detail and "os._exit" in check.detail, check


@pytest.mark.slow
def test_the_doctor_fails_an_exiting_or_hanging_plugin_and_still_judges_a_wrong_one():
    """sys.exit(0) ended the doctor with exit 0, a sleep hung it; a wrong implementation keeps its real verdict."""
    from topk_bench.doctor import isolated
    from topk_bench.doctor.check import Result

    plugins = (str(MISBEHAVING), str(PLUGINS / "wrong_attention.py"))
    found = {c.name: c for c in isolated.checks(["test_sys_exit", "test_sleeps", "test_wrong"], "cpu", plugins,
                                                limit_s=90)}
    assert all(found[f"agreement: {n}"].result is Result.FAIL for n in ("test_sys_exit", "test_sleeps",
                                                                         "test_wrong")), found
    assert "ended (exit code 0)" in found["agreement: test_sys_exit"].detail
    assert "did not finish within 90 s" in found["agreement: test_sleeps"].detail
    assert "float64: max rel err" in found["agreement: test_wrong"].detail
    assert found["peak = predicted: test_wrong"].result is Result.PASS


@pytest.mark.slow
def test_doctor_with_a_plugin_that_exits_fails_naming_it():
    result = _topk_bench("doctor", "--plugins", MISBEHAVING, timeout=1200)
    assert result.returncode == 1, result.stdout + result.stderr
    failed = [line for line in result.stdout.splitlines() if "checks failed" in line]
    assert failed and all(f"agreement: {n}" in failed[0] for n in ("test_os_exit", "test_sys_exit", "test_sleeps"))
    assert "agreement: vanilla" in result.stdout  # the others still ran


# --- plot runs no code a results folder names ----------------------------------------------------------

@pytest.mark.parametrize("renderer", ["this:x", "os:getcwd", "topk_bench.fileio:write_atomic"])
def test_plot_does_not_import_a_renderer_named_by_someone_elses_meta_json(measured, cli, tmp_path, renderer):
    """"renderer": "this:x" printed the Zen of Python: plotting someone else's results ran their choice of code."""
    import json

    meta = measured.with_name("tiny.meta.json")
    data = json.loads(meta.read_text())
    data["plot"]["renderer"] = renderer
    meta.write_text(json.dumps(data))
    result = cli("plot", measured.parent, "--out", tmp_path / "plots")
    line = result.error_line
    assert result.code == 2 and "plot.renderer" in line and repr(renderer) in line, line
    assert "Beautiful is better than ugly" not in result.out + result.err
    assert not (tmp_path / "plots").exists()


def test_plot_uses_a_renderer_the_users_own_code_registered_under_that_name(measured, tmp_path):
    import json

    import matplotlib.pyplot as plt

    from topk_bench.report.plots.figure import RENDERERS, plot_results, register_renderer

    meta = measured.with_name("tiny.meta.json")
    data = json.loads(meta.read_text())
    data["plot"]["renderer"] = "my_plots:bars"
    meta.write_text(json.dumps(data))
    calls = []
    register_renderer("my_plots:bars", lambda rows, spec, device, method: calls.append(len(rows)) or plt.figure())
    try:
        written = plot_results(measured.parent, tmp_path / "plots")
    finally:
        RENDERERS.pop("my_plots:bars")
    assert calls == [3] and [p.name for p in written] == ["tiny-cpu-measured.png"]


# --- --no-resume keeps the old rows until their cases have new ones -----------------------------------

@pytest.mark.parametrize("sig", ["SIGINT", "SIGKILL"])
def test_no_resume_interrupted_after_one_case_keeps_every_other_old_row(tmp_path, sig):
    """The old rows were removed first: interrupted after one case, the file held one row. Now each old row
    goes only once its case has a new one (after the run, or, after a SIGKILL, at the next run)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from runner_fakes import MARK_VARIABLE, FakeRun, interruptible, write_suite
    from topk_bench.results import store
    from topk_bench.run import runner
    from topk_bench.run.executors import LocalExecutor

    suite, out, marks = write_suite(tmp_path), tmp_path / "out", tmp_path / "marks"
    runner.run(suite, Flags(out=out, device="cpu"), progress=False, executor_obj=LocalExecutor(run=FakeRun(
        status=lambda case: "error")))  # the old measurements: 8 rows, each "error" (told apart from the new)
    command = [sys.executable, str(Path(__file__).parent / "runner_fakes.py"), str(suite), str(out), "1.0",
               "--no-resume"]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible,
                            env={**os.environ, MARK_VARIABLE: str(marks),  # this checkout's topk_bench
                                 "PYTHONPATH": str(Path(__file__).parents[1])})
    deadline = time.monotonic() + 120
    while not marks.exists() or not marks.read_text().strip():
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before the test could interrupt it"
        time.sleep(0.01)
    time.sleep(0.2)  # the row of the case that ended is written
    proc.send_signal(getattr(signal, sig))
    assert proc.wait(30) == (130 if sig == "SIGINT" else -9), proc.stderr.read()
    remeasured = set(marks.read_text().split())
    if sig == "SIGKILL":  # no chance to tidy up: old and new rows of a case both there, the next run keeps the new
        assert len({r["case_id"] for r in store.read(out / "fake.csv").rows}) == 8
        later = FakeRun()
        runner.run(suite, Flags(out=out, device="cpu"), progress=False, executor_obj=LocalExecutor(run=later))
        assert later.ran == []  # every case has a row: resume runs none
    rows = store.read(out / "fake.csv").rows
    assert len(rows) == len({r["case_id"] for r in rows}) == 8, [r["status"] for r in rows]
    by_id = {r["case_id"]: r["status"] for r in rows}
    assert remeasured and all(by_id[cid] == "ok" for cid in remeasured)
    assert sorted(by_id.values()) == ["error"] * (8 - len(remeasured)) + ["ok"] * len(remeasured)


# --- what an implementation returns, and what it does to its inputs ------------------------------------

CONTRACT_BREAKERS = '''
import torch
import implementations
from implementations import Implementation

vanilla = implementations.get("vanilla")


def narrow(q, k, v, *, causal=False, activation="softmax"):
    return vanilla(q, k, v, causal=causal, activation=activation)[..., :1]     # [B, H, L, 1]: wrong shape


def doubled(q, k, v, *, causal=False, activation="softmax"):
    return vanilla(q, k, v, causal=causal, activation=activation).double()      # the wrong dtype


def zeroes_its_values(q, k, v, *, causal=False, activation="softmax"):
    with torch.no_grad():
        v.zero_()                                                               # its input, in place
    return vanilla(q, k, v, causal=causal, activation=activation)


for _impl in (Implementation("test_narrow", narrow, "wrong shape", predictable=False),
              Implementation("test_doubled", doubled, "wrong dtype", predictable=False),
              Implementation("test_zeroes", zeroes_its_values, "writes into v", predictable=False)):
    if _impl.name not in implementations.names():
        implementations.register(_impl)
'''


def _prefill_case(tmp_path, impl, **fields):
    from topk_bench.case import Case

    plugin = tmp_path / "breakers.py"
    plugin.write_text(CONTRACT_BREAKERS)
    return Case.make(suite="t", workload="prefill", impl=impl, mode="fwd", causal=True, warmup=0, repeats=1,
                     params={"seq_len": 32, "batch": 1, "q_heads": 2, "kv_heads": 2, "head_dim": 8},
                     plugins=(str(plugin),), **fields)


@pytest.mark.parametrize("impl,words", [("test_narrow", "shape [1, 2, 32, 1]"), ("test_doubled", "torch.float64")])
def test_an_output_of_the_wrong_shape_or_dtype_is_an_error_not_a_measurement(tmp_path, impl, words, single_thread):
    """It was recorded ok, with a time and a peak."""
    from topk_bench.child.execute import execute

    result = execute(_prefill_case(tmp_path, impl))
    assert result.status == "error" and result.times_s == [], result
    assert f"implementation '{impl}' returned" in result.error and words in result.error, result.error
    assert "expected [1, 2, 32, 8]" in result.error, result.error


def test_selection_quality_is_computed_on_copies_of_the_inputs(tmp_path, single_thread):
    """An implementation that zeroes its v scored attn_rel_err 0.0: the reference was computed on the zeroed v."""
    from topk_bench.child.execute import execute

    result = execute(_prefill_case(tmp_path, "test_zeroes", quality=("random",)))
    assert result.status == "ok", result.error
    assert result.extra["attn_rel_err"] == pytest.approx(1.0), result.extra


# --- a stopped template --------------------------------------------------------------------------------

def test_a_stopped_template_costs_a_case_a_row_in_bounded_time_and_the_next_case_runs(tmp_path):
    """SIGSTOP to the template hung the run past every case's time limit (the parent waited for answers a
    stopped process never sends). Now the case is crashed, saying why, within seconds; the next one runs."""
    import os
    import signal
    import threading
    import time

    from topk_bench.case import Budget, Case
    from topk_bench.run import launcher

    case = Case.make(suite="t", workload="mha", impl="vanilla", params={"seq_len": 8, "d_model": 8, "heads": 2},
                     mode="fwd", warmup=0, repeats=1)
    template = launcher.template_for(launcher._child_env(None))
    assert launcher.run_isolated(case, Budget(max_seconds=60)).status == "ok"  # warm: forks at once
    os.kill(template.proc.pid, signal.SIGSTOP)
    results = []
    worker = threading.Thread(target=lambda: results.append(launcher.run_isolated(case, Budget(max_seconds=5))),
                              daemon=True)
    started = time.monotonic()
    try:
        worker.start()
        worker.join(60)
        elapsed = time.monotonic() - started
        assert results, "the case never ended: the run hung on a stopped template"
    finally:
        try:
            os.kill(template.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    [result] = results
    assert result.status == "crashed" and "stopped" in result.error, result
    assert elapsed < 30, elapsed
    assert template.proc.wait(10) == -9  # it was killed, not left stopped
    assert launcher.run_isolated(case, Budget(max_seconds=60)).status == "ok"  # a new template serves the next


# --- low: temporary names, symlinks, a byte-order mark -------------------------------------------------

def test_two_processes_replacing_one_file_never_collide_on_a_temporary_name(tmp_path):
    """Two `plot` runs into one --out wrote the same figure through one temporary name: one process's rename
    found it gone (or renamed the other's half-written bytes)."""
    import subprocess
    import sys

    target = tmp_path / "figure.png"
    script = ("import sys\nfrom topk_bench import fileio\n"
              "data = sys.argv[2].encode() * 20000\n"
              "for _ in range(300):\n    fileio.write_atomic(sys.argv[1], data)\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(target), mark], stderr=subprocess.PIPE, text=True,
                              cwd=Path(__file__).parents[1]) for mark in "AB"]
    errors = [(p.wait(300), p.stderr.read()) for p in procs]
    assert errors == [(0, ""), (0, "")], errors
    assert target.read_bytes() in (b"A" * 20000, b"B" * 20000)
    assert [p.name for p in tmp_path.iterdir()] == ["figure.png"]  # no temporary file left behind


def test_a_symlinked_results_csv_stays_a_link_when_its_header_widens(measured, cli, tmp_path):
    elsewhere = tmp_path / "kept" / "tiny.csv"
    elsewhere.parent.mkdir()
    measured.rename(elsewhere)
    measured.symlink_to(elsewhere)
    suite = tiny_suite(tmp_path, sizes=(16,), file="other")
    suite.write_text(suite.read_text().replace('name = "vanilla"', 'name = "qchunk"\nchunk_size = 8'))
    assert cli("run", suite, "--out", measured.parent, "-q").code == 0
    assert measured.is_symlink() and measured.resolve() == elsewhere.resolve()
    assert "chunk_size" in elsewhere.read_text().splitlines()[0] and len(elsewhere.read_text().splitlines()) == 5


@pytest.mark.parametrize("which", ["suite", "bench.toml"])
def test_a_toml_file_with_a_byte_order_mark_is_read(tmp_path, cli, which):
    """An editor's BOM gave "Invalid statement (at line 1, column 1)"."""
    suite = tiny_suite(tmp_path)
    config = tmp_path / "bench.toml"
    config.write_text("repeats = 1\n")
    target = suite if which == "suite" else config
    target.write_bytes(b"\xef\xbb\xbf" + target.read_bytes())
    result = cli("run", suite, "--out", tmp_path / "out", "--config", config, "-q")
    assert result.code == 0, result.err
