"""The runner with a scripted executor: CSV and meta.json, resume, skip-larger, lock, predict, interruption."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import filelock
import pytest

from locations import TESTS
from runner_fakes import MARK_VARIABLE, SUITE, FakeRun, interruptible, write_suite
from topk_bench import load_results
from topk_bench.errors import BadInput
from topk_bench.results.columns import REQUIRED_COLUMNS
from topk_bench.run import plan as planning
from topk_bench.run import runner
from topk_bench.run.executors import LocalExecutor
from topk_bench.run.resolve import Flags

HERE = TESTS


def run(suite, out, fake, resume=True, yes=False, **flags):
    return runner.run(
        suite,
        Flags(out=out, device="cpu", **flags),
        progress=False,
        resume=resume,
        yes=yes,
        executor_obj=LocalExecutor(run=fake),
    )


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_run_writes_one_row_per_case_with_required_columns_first_and_meta(tmp_path):
    suite = write_suite(tmp_path)
    result = run(suite, tmp_path / "out", FakeRun())
    header = next(csv.reader(open(result.csv_path)))
    assert tuple(header[: len(REQUIRED_COLUMNS)]) == REQUIRED_COLUMNS
    assert header[len(REQUIRED_COLUMNS) :][:3] == ["seq_len", "batch", "d_model"]
    assert {"heads", "chunk_size", "causal", "activation", "dtype"} <= set(header)
    written = rows(result.csv_path)
    assert len(written) == 8 and len({r["case_id"] for r in written}) == 8
    first = written[0]
    assert first["status"] == "ok" and first["method"] == "measured" and first["device"] == "cpu"
    assert first["times_s"] == "0.016;0.032;0.048" and float(first["time_median_s"]) == pytest.approx(0.032)
    assert first["repeats"] == "3" and first["causal"] == "True"
    qchunk = [r for r in written if r["impl"] == "qchunk"]
    assert {r["chunk_size"] for r in qchunk} == {"8"} and {
        r["chunk_size"] for r in written if r["impl"] == "vanilla"
    } == {""}
    meta = json.loads((tmp_path / "out" / "fake.meta.json").read_text())
    assert meta["suite"] == "fake" and meta["workload"] == "mha"
    assert meta["plot"] == {
        "x": "seq_len",
        "x_label": None,
        "log_x": None,
        "log_y": False,
        "panels": [],
        "metrics": ["memory", "time"],
        "memory": "allocated",
        "split": [],
        "renderer": None,
        "pareto": False,
    }
    assert result.written == {"ok": 8}


def test_sizes_run_smallest_first_for_every_implementation(tmp_path):
    fake = FakeRun()
    run(write_suite(tmp_path), tmp_path / "out", fake)
    lengths = [c.param_dict["seq_len"] for c in fake.ran]
    assert lengths == sorted(lengths)


def test_resume_measures_only_missing_cases_and_no_resume_starts_over(tmp_path):
    suite, out = write_suite(tmp_path), tmp_path / "out"
    run(suite, out, FakeRun())
    csv_path = out / "fake.csv"
    again = FakeRun()
    run(suite, out, again)
    assert again.ran == [] and len(rows(csv_path)) == 8

    kept = rows(csv_path)
    removed = kept.pop(3)
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(removed))
        writer.writeheader()
        writer.writerows(kept)
    third = FakeRun()
    run(suite, out, third)
    assert [c.case_id for c in third.ran] == [removed["case_id"]]
    assert sorted(r["case_id"] for r in rows(csv_path)) == sorted(r["case_id"] for r in kept + [removed])

    fresh = FakeRun()
    run(suite, out, fresh, resume=False)
    assert len(fresh.ran) == 8 and len(rows(csv_path)) == 8


def test_no_resume_starts_over_only_the_cases_of_this_run(tmp_path):
    suite, out = write_suite(tmp_path), tmp_path / "out"
    run(suite, out, FakeRun(), predict=True)
    run(suite, out, FakeRun())
    predicted = [r for r in rows(out / "fake.csv") if r["method"] == "predicted"]
    fresh = FakeRun()
    run(suite, out, fresh, resume=False)
    assert len(fresh.ran) == 8
    after = rows(out / "fake.csv")
    assert len(after) == 16 and [r for r in after if r["method"] == "predicted"] == predicted


def test_more_repeats_resume_but_another_device_or_method_is_a_new_case(tmp_path):
    suite, out = write_suite(tmp_path), tmp_path / "out"
    run(suite, out, FakeRun())
    more = FakeRun()
    run(suite, out, more, repeats=5)
    assert more.ran == []
    predicted = FakeRun()
    run(suite, out, predicted, predict=True)
    assert len(predicted.ran) == 8 and {c.method for c in predicted.ran} == {"predicted"}
    assert len(rows(out / "fake.csv")) == 16


@pytest.mark.parametrize("status", ["oom", "over_budget", "timeout"])
def test_larger_sizes_are_skipped_after_a_budget_failure_without_running(tmp_path, status):
    fake = FakeRun(lambda c: status if c.impl == "vanilla" and c.param_dict["seq_len"] >= 32 else "ok")
    result = run(write_suite(tmp_path), tmp_path / "out", fake)
    ran = {(c.impl, c.param_dict["seq_len"]) for c in fake.ran}
    assert ("vanilla", 64) not in ran and ("vanilla", 128) not in ran
    assert {("qchunk", n) for n in (16, 32, 64, 128)} <= ran
    by_size = {(r["impl"], int(r["seq_len"])): r for r in rows(result.csv_path)}
    assert by_size[("vanilla", 32)]["status"] == status
    for n in (64, 128):
        assert by_size[("vanilla", n)]["status"] == "skipped"
        assert f"vanilla hit {status} at seq_len=32" in by_size[("vanilla", n)]["error"]
    assert result.written == {"ok": 5, status: 1, "skipped": 2}


def test_crashes_and_errors_do_not_skip_larger_sizes(tmp_path):
    fake = FakeRun(lambda c: "crashed" if c.impl == "vanilla" and c.param_dict["seq_len"] == 32 else "ok")
    run(write_suite(tmp_path), tmp_path / "out", fake)
    assert len(fake.ran) == 8


def test_skip_rule_applies_on_resume_from_rows_of_an_earlier_run(tmp_path):
    suite, out = write_suite(tmp_path), tmp_path / "out"
    run(suite, out, FakeRun(lambda c: "oom" if c.impl == "vanilla" and c.param_dict["seq_len"] >= 32 else "ok"))
    csv_path = out / "fake.csv"
    kept = [r for r in rows(csv_path) if r["status"] != "skipped"]
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(kept[0]))
        writer.writeheader()
        writer.writerows(kept)
    again = FakeRun()
    result = run(suite, out, again)
    assert again.ran == [] and result.written == {"skipped": 2}


def test_with_several_jobs_a_larger_size_waits_for_the_smaller_one(tmp_path):
    fake = FakeRun(lambda c: "oom" if c.param_dict["seq_len"] >= 32 else "ok", delay_s=0.05)
    result = runner.run(
        write_suite(tmp_path),
        Flags(out=tmp_path / "out", device="cpu"),
        progress=False,
        executor_obj=LocalExecutor(jobs=4, run=fake),
    )
    assert 1 < fake.max_active <= 2  # two implementations in parallel, never two sizes of one
    assert len(fake.ran) == 4 and result.written == {"ok": 2, "oom": 2, "skipped": 4}


def test_a_batch_executor_gets_every_case_at_once_and_larger_sizes_are_cancelled(tmp_path):
    class Batch(LocalExecutor):
        prefers_batches = True

        def submit(self, cases, budget):
            self.submitted = getattr(self, "submitted", []) + [len(cases)]
            return super().submit(cases, budget)

    fake = FakeRun(lambda c: "oom" if c.impl == "vanilla" and c.param_dict["seq_len"] >= 32 else "ok", delay_s=0.3)
    executor = Batch(jobs=1, run=fake)
    result = runner.run(
        write_suite(tmp_path), Flags(out=tmp_path / "out", device="cpu"), progress=False, executor_obj=executor
    )
    assert executor.submitted == [8]
    ran = {(c.impl, c.param_dict["seq_len"]) for c in fake.ran}
    assert ("vanilla", 64) not in ran and ("vanilla", 128) not in ran  # cancelled before they started
    assert result.written == {"ok": 5, "oom": 1, "skipped": 2}


def test_a_second_run_on_the_same_file_is_refused_while_the_first_holds_the_lock(tmp_path):
    suite, out = write_suite(tmp_path), tmp_path / "out"
    out.mkdir()
    with filelock.FileLock(out / ".fake.csv.lock"):
        with pytest.raises(BadInput, match="another topk-bench run is writing this file"):
            run(suite, out, FakeRun())
    assert not (out / "fake.csv").exists()
    run(suite, out, FakeRun())  # lock released: runs
    assert len(rows(out / "fake.csv")) == 8


@pytest.mark.slow
def test_two_concurrent_processes_leave_one_intact_file_without_duplicates(tmp_path):
    suite, out = write_suite(tmp_path), tmp_path / "out"
    command = [sys.executable, str(HERE / "runner_fakes.py"), str(suite), str(out), "0.5"]
    procs = [subprocess.Popen(command, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = sorted((p.wait(60), p.stderr.read()) for p in procs)
    assert results[0][0] == 0
    assert results[1][0] == 1 and "another topk-bench run is writing this file" in results[1][1]
    written = rows(out / "fake.csv")
    assert len(written) == 8 and len({r["case_id"] for r in written}) == 8


def test_extra_measurement_columns_widen_the_header_keeping_earlier_rows(tmp_path):
    fake = FakeRun(extra=lambda c: {"rel_err": 0.5} if c.param_dict["seq_len"] == 64 else {})
    result = run(write_suite(tmp_path), tmp_path / "out", fake)
    written = rows(result.csv_path)
    assert len(written) == 8 and list(written[0])[-1] == "rel_err"
    assert [r["rel_err"] for r in written if r["seq_len"] == "64"] == ["0.5", "0.5"]
    assert all(r["rel_err"] == "" for r in written if r["seq_len"] != "64")


def test_predict_marks_unpredictable_implementations_unsupported_without_running(tmp_path, monkeypatch):
    plugin = tmp_path / "eager_attention.py"
    plugin.write_text(
        "import topk_bench.attention\n"
        "from topk_bench.attention import Implementation\n"
        "def eager(q, k, v, *, causal=False, activation='softmax'):\n"
        "    return topk_bench.attention.get('vanilla')(q, k, v, causal=causal, activation=activation)\n"
        "topk_bench.attention.register(Implementation(name='eager_test_impl', fn=eager, description='data-dependent',"
        " predictable=False))\n"
    )
    suite = write_suite(
        tmp_path,
        text='plugins = ["eager_attention.py"]\n' + 'name = "{name}"\nworkload = "mha"\n'
        '[sweep]\nseq_len = [16, 32]\n[[impl]]\nname = "eager_test_impl"\n[[impl]]\nname = "vanilla"\n',
    )
    fake = FakeRun()
    result = run(suite, tmp_path / "out", fake, predict=True)
    assert {c.impl for c in fake.ran} == {"vanilla"}
    unsupported = [r for r in rows(result.csv_path) if r["impl"] == "eager_test_impl"]
    assert [r["status"] for r in unsupported] == ["unsupported", "unsupported"]
    assert all(r["method"] == "predicted" and "cannot be predicted" in r["error"] for r in unsupported)
    assert {c.plugins for c in fake.ran} == {(str(plugin.resolve()),)}


def test_cpu_memory_budget_never_exceeds_available_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(planning, "available_memory_bytes", lambda: 2**30)
    plan = planning.plan(write_suite(tmp_path), Flags(device="cpu", max_memory_gib=30))
    assert plan.budget.max_memory_bytes == 2**30 and any("capped" in n for n in plan.notes)
    predicted = planning.plan(write_suite(tmp_path), Flags(predict=True, max_memory_gib=30))
    assert predicted.budget.max_memory_bytes == 30 * 2**30  # predicting allocates nothing


def test_predict_targets_cuda_only_when_asked_and_needs_no_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(planning.torch.cuda, "is_available", lambda: False)
    cuda = planning.plan(write_suite(tmp_path), Flags(predict=True, device="cuda"))
    assert {(c.device, c.method) for c in cuda.cases} == {("cuda", "predicted")}
    for device in (None, "auto", "cpu"):
        assert {c.device for c in planning.plan(write_suite(tmp_path), Flags(predict=True, device=device)).cases} == {
            "cpu"
        }
    with pytest.raises(BadInput, match="--device"):
        planning.plan(write_suite(tmp_path), Flags(predict=True, device="tpu"))


def test_memory_budget_is_capped_to_what_the_device_or_machine_has(monkeypatch):
    gib = 2**30
    # A 24 GiB GPU cannot reach the default 30 GiB: past 24 GiB a case is oom, so the budget says 24.
    budget, note = planning.capped_budget(30 * gib, 24 * gib, "the device's memory")
    assert budget == 24 * gib and note == "memory budget capped to the device's memory, 24.0 GiB (asked 30 GiB)"
    assert planning.capped_budget(30 * gib, 80 * gib, "the device's memory") == (30 * gib, None)
    assert planning.capped_budget(30 * gib, None, "") == (30 * gib, None)  # unknown: as asked
    monkeypatch.setattr(planning, "device_memory_bytes", lambda device: 80 * gib if device == "cuda" else None)
    monkeypatch.setattr(planning, "available_memory_bytes", lambda: 3 * gib)
    assert planning.memory_cap("cuda", predict=False) == (80 * gib, "the device's memory")
    assert planning.memory_cap("cpu", predict=False) == (3 * gib, "the available memory")
    assert planning.memory_cap("cuda", predict=True) == (None, "")  # predicting allocates nothing


def test_a_cuda_run_has_a_workspace_column_measured_or_predicted_and_a_cpu_run_does_not(tmp_path):
    import dataclasses

    plan = planning.plan(write_suite(tmp_path), Flags(device="cpu"))
    assert "workspace_bytes" not in plan.header
    assert "workspace_bytes" not in planning.plan(write_suite(tmp_path), Flags(predict=True)).header
    cuda = [dataclasses.replace(c, device="cuda") for c in plan.cases]
    assert "workspace_bytes" in planning.optional_columns(plan.suite, cuda)
    assert "cuda_unmodeled_ops" not in planning.optional_columns(plan.suite, cuda)
    predicted = [dataclasses.replace(c, method="predicted") for c in cuda]  # the cuBLAS workspaces predicted
    assert {"workspace_bytes", "cuda_unmodeled_ops"} <= set(planning.optional_columns(plan.suite, predicted))


def test_precedence_bench_toml_then_suite_then_arguments(tmp_path, monkeypatch):
    (tmp_path / "bench.toml").write_text(
        'repeats = 7\nwarmup = 2\nmax_case_seconds = 11\nresults_dir = "res"\n[executor]\njobs = 3\n'
    )
    suite = write_suite(
        tmp_path,
        text='name = "{name}"\nworkload = "mha"\nwarmup = 4\n[sweep]\nseq_len = [16]\n[[impl]]\nname = "vanilla"\n',
    )
    monkeypatch.chdir(tmp_path)
    plan = planning.plan(suite, Flags(device="cpu"))
    case = plan.cases[0]
    assert (case.repeats, case.warmup, plan.budget.max_seconds) == (7, 4, 11)
    assert plan.csv_path == tmp_path / "res" / "fake.csv" and plan.executor.jobs == 3
    assert any("compete for cores" in n for n in plan.notes)
    plan = planning.plan(
        suite, Flags(device="cpu", repeats=2, warmup=0, max_case_seconds=5, jobs=1, out=tmp_path / "o")
    )
    case = plan.cases[0]
    assert (case.repeats, case.warmup, plan.budget.max_seconds, plan.executor.jobs) == (2, 0, 5, 1)
    assert plan.csv_path == tmp_path / "o" / "fake.csv" and not any("compete" in n for n in plan.notes)


def test_run_suite_and_load_results_return_dataframes(tmp_path, monkeypatch):
    import topk_bench
    from topk_bench.run import executors

    fake = FakeRun()
    real = executors.LocalExecutor
    monkeypatch.setattr(runner, "get_executor", lambda settings, **_: real(jobs=settings.jobs, run=fake))
    frame = topk_bench.run_suite(write_suite(tmp_path), out=tmp_path / "out", device="cpu")
    assert len(frame) == 8 and list(frame.columns[: len(REQUIRED_COLUMNS)]) == list(REQUIRED_COLUMNS)
    assert frame["seq_len"].tolist() == [16, 16, 32, 32, 64, 64, 128, 128]
    loaded = load_results(tmp_path / "out")
    assert loaded["case_id"].tolist() == frame["case_id"].tolist()
    with pytest.raises(TypeError):
        topk_bench.run_suite(write_suite(tmp_path), no_such_override=1)


# ------------------------------------------------------------------ interruption


def _wait_rows(path: Path, n: int, proc: subprocess.Popen, limit_s: float = 60) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if path.exists() and len(rows(path)) >= n:
            return
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.02)
    raise AssertionError(f"fewer than {n} rows after {limit_s} s")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_interrupted_run_keeps_complete_rows_and_a_rerun_completes_without_duplicates(tmp_path, sig):
    suite, out = write_suite(tmp_path), tmp_path / "out"
    csv_path = out / "fake.csv"
    # 1 s a case: 5 s of cases left when the third row is in, so that even a starved test process
    # interrupts the run before it ends.
    command = [sys.executable, str(HERE / "runner_fakes.py"), str(suite), str(out), "1.0"]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    _wait_rows(csv_path, 3, proc)
    assert proc.poll() is None, "the run ended before the test could interrupt it"
    proc.send_signal(sig)
    code = proc.wait(30)
    assert code == (130 if sig == signal.SIGINT else -signal.SIGKILL)
    assert "Traceback" not in proc.stderr.read()
    kept = rows(csv_path)
    assert 3 <= len(kept) < 8
    header = next(csv.reader(open(csv_path)))
    assert all(None not in r and len(r) == len(header) and r["status"] == "ok" for r in kept)
    assert open(csv_path, "rb").read().endswith(b"\n")

    again = subprocess.run(command[:-1] + ["0"], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    final = rows(csv_path)
    assert len(final) == 8 and len({r["case_id"] for r in final}) == 8
    assert final[: len(kept)] == kept  # rows already written are untouched


def test_progress_bar_on_a_terminal_and_one_line_per_case_elsewhere(tmp_path):
    import io

    from rich.console import Console

    from topk_bench.run.progress import Reporter

    for terminal in (True, False):
        buffer = io.StringIO()
        console = Console(file=buffer, force_terminal=terminal, width=150)
        with Reporter("mha", total=3, done=1, console=console) as reporter:
            reporter.running("Top-k seq_len=1024")
            reporter.finished("Top-k seq_len=1024", {"status": "ok", "peak_bytes": 2**30, "time_median_s": 0.5})
        text = buffer.getvalue()
        assert "[2/3] Top-k seq_len=1024: ok  peak 1.00 GiB  time 500 ms" in text
        assert ("mha" in text and "2/3" in text) if terminal else "elapsed" not in text


def test_import_topk_bench_does_not_import_torch():
    code = "import sys, topk_bench; assert 'torch' not in sys.modules and callable(topk_bench.run_suite)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def _timeout_above_16(case):
    return "timeout" if case.impl == "vanilla" and case.param_dict["seq_len"] >= 32 else "ok"


def test_a_timeout_runs_again_under_a_larger_time_budget_and_not_under_the_same(tmp_path):
    suite, out = write_suite(tmp_path), tmp_path / "out"
    first = run(suite, out, FakeRun(_timeout_above_16), max_case_seconds=5)
    by_size = {(r["impl"], int(r["seq_len"])): r for r in rows(first.csv_path)}
    assert by_size[("vanilla", 32)]["max_case_seconds"] == "5"
    assert float(by_size[("vanilla", 32)]["max_memory_bytes"]) > 0

    same = FakeRun()
    result = run(suite, out, same, max_case_seconds=5)
    assert same.ran == [] and result.written == {}
    assert any("1 case(s) that failed (timeout) under the same budget were not run again" in n for n in result.notes)
    assert result.notes[-1].endswith("--no-resume")

    larger = FakeRun()
    result = run(suite, out, larger, max_case_seconds=10)
    assert sorted((c.impl, c.param_dict["seq_len"]) for c in larger.ran) == [
        ("vanilla", 32),
        ("vanilla", 64),
        ("vanilla", 128),
    ]
    assert any(
        "retried 1 failed case(s)" in n and "2 skipped larger" in n and "5 s, now 10 s" in n for n in result.notes
    )
    frame = load_results(out)  # the old rows went: one row per case, nothing left out
    assert len(frame) == 8 and frame.attrs["dropped"] == [] and set(frame["status"]) == {"ok"}
    assert set(frame["max_case_seconds"]) == {5, 10}


def test_over_budget_runs_again_only_when_the_memory_budget_grew(tmp_path):
    suite, out = write_suite(tmp_path), tmp_path / "out"
    over = lambda c: "over_budget" if c.impl == "vanilla" and c.param_dict["seq_len"] >= 32 else "ok"  # noqa: E731
    run(suite, out, FakeRun(over), max_memory_gib=0.5)
    # A few percent more is the CPU cap moving, not a budget; at 1 GiB vanilla 32 runs again, fails again, and its
    # larger sizes stay skipped.
    for gib, expected in ((0.5, []), (0.51, []), (1.0, [32])):
        again = FakeRun(over)
        run(suite, out, again, max_memory_gib=gib)
        assert [c.param_dict["seq_len"] for c in again.ran] == expected, gib
    assert len(load_results(out)) == 8


def test_failed_rows_of_an_older_csv_without_a_budget_are_not_retried(tmp_path):
    suite, out = write_suite(tmp_path), tmp_path / "out"
    run(suite, out, FakeRun(_timeout_above_16), max_case_seconds=5)
    csv_path = out / "fake.csv"
    old = [{k: v for k, v in r.items() if k not in ("max_case_seconds", "max_memory_bytes")} for r in rows(csv_path)]
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(old[0]))
        writer.writeheader()
        writer.writerows(old)
    again = FakeRun()
    run(suite, out, again, max_case_seconds=50)
    assert again.ran == []


def test_rows_record_the_machine_and_the_trust_flag_of_the_measurement(tmp_path):
    fake = FakeRun()
    original = fake.__call__

    def measured(case, budget):
        m = original(case, budget)
        m.metadata.update(load_start=3.0 if case.impl == "vanilla" else 0.2, load_end=0.3, steal=0.0)
        return m

    result = runner.run(
        write_suite(tmp_path),
        Flags(out=tmp_path / "out", device="cpu"),
        progress=False,
        executor_obj=LocalExecutor(run=measured),
    )
    written = rows(result.csv_path)
    for r in written:  # FakeRun's samples are 1, 2, 3 ms x seq_len: CV 0.5
        assert float(r["time_cv"]) == pytest.approx(0.5)
        assert r["trust"] == ("busy;noisy" if r["impl"] == "vanilla" else "noisy")
        assert float(r["load_end"]) == 0.3 and r["steal"] == "0.0"


def test_the_next_command_is_suggested_after_a_run(tmp_path, capsys):
    result = run(write_suite(tmp_path), tmp_path / "out", FakeRun())
    runner.print_summary(result)
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("next: topk-bench show ") and "--predict" in lines[-1]


def test_rounds_interleave_the_cases_and_each_row_pools_every_rounds_times(tmp_path):
    fake = FakeRun()
    result = run(write_suite(tmp_path), tmp_path / "out", fake, rounds=3)
    ids = [c.case_id for c in fake.ran]
    first = ids[:8]
    # Round 1 in the plan's order (smaller sizes first), round 2 backwards, round 3 forwards again.
    assert len(ids) == 24 and ids[8:16] == first[::-1] and ids[16:] == first
    written = rows(result.csv_path)
    assert len(written) == 8 and result.written == {"ok": 8}
    smallest = next(r for r in written if r["impl"] == "vanilla" and r["seq_len"] == "16")
    assert smallest["repeats"] == "9" and smallest["times_s"] == ";".join(["0.016;0.032;0.048"] * 3)


def test_a_round_that_fails_writes_its_row_at_once_and_the_case_runs_no_more(tmp_path):
    calls = {}

    def status(case):  # vanilla at 32 times out in its second round
        calls[case.case_id] = calls.get(case.case_id, 0) + 1
        slow = case.impl == "vanilla" and case.param_dict["seq_len"] == 32 and calls[case.case_id] == 2
        return "timeout" if slow else "ok"

    fake = FakeRun(status)
    result = run(write_suite(tmp_path), tmp_path / "out", fake, rounds=3)
    by_size = {(r["impl"], int(r["seq_len"])): r for r in rows(result.csv_path)}
    assert len(by_size) == 8 and result.written == {"ok": 7, "timeout": 1}
    failed = by_size[("vanilla", 32)]
    assert failed["status"] == "timeout" and failed["error"] == "round 2 of 3: scripted timeout"
    assert sum(c.case_id == failed["case_id"] for c in fake.ran) == 2
    # A later round skips nothing: the larger sizes were ok in round 1 and keep their 3 rounds.
    assert by_size[("vanilla", 64)]["status"] == "ok" and by_size[("vanilla", 64)]["repeats"] == "9"


def test_rounds_in_the_first_round_keep_the_skip_larger_rule(tmp_path):
    fake = FakeRun(lambda c: "oom" if c.impl == "vanilla" and c.param_dict["seq_len"] >= 64 else "ok")
    result = run(write_suite(tmp_path), tmp_path / "out", fake, rounds=2)
    assert result.written == {"ok": 6, "oom": 1, "skipped": 1}
    assert len(fake.ran) == 7 + 6  # the oom case once, the 6 ok cases twice; the skipped one never


def test_a_prediction_runs_each_case_once_whatever_the_rounds(tmp_path):
    fake = FakeRun()
    result = run(write_suite(tmp_path), tmp_path / "out", fake, rounds=4, predict=True)
    assert len(fake.ran) == 8 and result.written == {"ok": 8}
    assert any("a prediction is exact, each case is predicted once" in note for note in result.plan.notes)


def test_pooled_rounds_take_the_largest_peak_and_the_load_from_first_to_last():
    from topk_bench.case import Measurement

    rounds = [
        Measurement(
            status="ok",
            peak_bytes=10,
            reserved_bytes=None,
            times_s=[1.0],
            fwd_times_s=[0.4],
            metadata={"load_start": 0.1, "load_end": 0.2, "steal": 0.0, "git_sha": "a"},
        ),
        Measurement(
            status="ok",
            peak_bytes=12,
            reserved_bytes=None,
            times_s=[2.0, 3.0],
            fwd_times_s=[0.5],
            metadata={"load_start": 0.5, "load_end": 0.9, "steal": 0.3, "git_sha": "a"},
        ),
    ]
    merged = runner.pooled(rounds)
    assert merged.times_s == [1.0, 2.0, 3.0] and merged.fwd_times_s == [0.4, 0.5]
    assert merged.peak_bytes == 12 and merged.reserved_bytes is None
    assert merged.metadata == {"load_start": 0.1, "load_end": 0.9, "steal": 0.3, "git_sha": "a", "rounds": 2}


@pytest.mark.slow
def test_a_run_interrupted_between_rounds_writes_no_partial_row_and_a_rerun_completes(tmp_path):
    suite = write_suite(tmp_path, text=SUITE.replace("causal = true", "causal = true\nrounds = 2"))
    out, marks = tmp_path / "out", tmp_path / "marks"
    command = [sys.executable, str(HERE / "runner_fakes.py"), str(suite), str(out), "0.3"]
    proc = subprocess.Popen(
        command,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,
        env={**os.environ, MARK_VARIABLE: str(marks)},
    )
    deadline = time.monotonic() + 60
    while not marks.exists() or len(marks.read_text().splitlines()) < 10:  # in round 2 of 2
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before the test could interrupt it"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 130 and "Traceback" not in proc.stderr.read()
    # Every case was still in its rounds: no row (not even a one-round row), so no file yet.
    assert not (out / "fake.csv").exists() or rows(out / "fake.csv") == []
    again = subprocess.run(command[:-1] + ["0"], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    final = rows(out / "fake.csv")
    assert len({r["case_id"] for r in final}) == len(final) == 8
    assert {r["repeats"] for r in final} == {"6"}  # 2 rounds of 3


def test_one_rule_of_precedence_for_every_layered_setting(tmp_path):
    from types import SimpleNamespace

    from topk_bench.run.resolve import Flags, layered

    bench = SimpleNamespace(repeats=3, warmup=1, dtype="float32", max_cases=1000)
    suite = SimpleNamespace(repeats=5, warmup=None, dtype="bfloat16", max_cases=None)
    flags = Flags(repeats=7)
    assert layered("repeats", flags, suite, bench) == 7  # the command line first
    assert layered("repeats", Flags(), suite, bench) == 5  # then the suite
    assert layered("warmup", flags, suite, bench) == 1  # then bench.toml
    assert layered("dtype", None, suite, bench) == "bfloat16" and layered("max_cases", None, suite, bench) == 1000
    assert layered("rounds", flags, suite, None) is None  # nobody gave it
    plan = planning.plan(write_suite(tmp_path), Flags(device="cpu", predict=True))
    assert plan.method == "predicted" and plan.device == "cpu" and plan.settings.predicted


def test_a_timeout_skips_only_larger_sizes_never_other_values_of_a_swept_option(tmp_path):
    # A timeout at chunk_size = 256 says nothing of chunk_size = 1024 at the same seq_len (a larger chunk may be
    # faster): only larger seq_len at chunk_size = 256 are skipped.
    text = SUITE.replace("seq_len = [16, 32, 64, 128]", "seq_len = [16, 32, 64]\nchunk_size = [4, 8]").replace(
        "chunk_size = 8\n", ""
    )
    text = text.replace('[[impl]]\nname = "vanilla"\n', "")
    fake = FakeRun(lambda c: "timeout" if c.option_dict["chunk_size"] == 4 and c.param_dict["seq_len"] == 32 else "ok")
    result = run(write_suite(tmp_path, text=text), tmp_path / "out", fake)
    by_case = {(int(r["seq_len"]), int(r["chunk_size"])): r for r in rows(result.csv_path)}
    assert {key: r["status"] for key, r in by_case.items()} == {
        (16, 4): "ok", (32, 4): "timeout", (64, 4): "skipped",
        (16, 8): "ok", (32, 8): "ok", (64, 8): "ok",
    }  # fmt: skip
    assert "qchunk hit timeout at seq_len=32 chunk_size=4" in by_case[(64, 4)]["error"]
