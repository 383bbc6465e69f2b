"""--no-resume keeps the old rows until their cases have new ones, interrupted or not."""

from __future__ import annotations

import pytest

from locations import ROOT, TESTS
from topk_bench.run.resolve import Flags

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
    runner.run(
        suite,
        Flags(out=out, device="cpu"),
        progress=False,
        executor_obj=LocalExecutor(run=FakeRun(status=lambda case: "error")),
    )  # the old measurements: 8 rows, each "error" (told apart from the new)
    command = [sys.executable, str(TESTS / "runner_fakes.py"), str(suite), str(out), "1.0", "--no-resume"]
    proc = subprocess.Popen(
        command,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,
        env={
            **os.environ,
            MARK_VARIABLE: str(marks),  # this checkout's topk_bench
            "PYTHONPATH": str(ROOT),
        },
    )
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
