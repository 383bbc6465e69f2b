"""A stopped template costs a case a row in bounded time, and the next case runs."""

from __future__ import annotations

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

    case = Case.make(
        suite="t",
        workload="mha",
        impl="vanilla",
        params={"seq_len": 8, "d_model": 8, "heads": 2},
        mode="fwd",
        warmup=0,
        repeats=1,
    )
    template = launcher.template_for(launcher._child_env(None))
    assert launcher.run_isolated(case, Budget(max_seconds=60)).status == "ok"  # warm: forks at once
    os.kill(template.proc.pid, signal.SIGSTOP)
    results = []
    worker = threading.Thread(
        target=lambda: results.append(launcher.run_isolated(case, Budget(max_seconds=5))), daemon=True
    )
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
