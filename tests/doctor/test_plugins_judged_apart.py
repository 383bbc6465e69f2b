"""The doctor judges a plug-in's implementation in a process of its own: one that exits or hangs fails,
named, and a wrong one is still judged."""

from __future__ import annotations

import pytest

from locations import TESTS

PLUGINS = TESTS / "plugins"


# --- plug-ins that end the process, at import or when called -------------------------------------------


def _topk_bench(*args, timeout=600):
    import os
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "topk_bench", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "250"},
    )


MISBEHAVING = PLUGINS / "misbehaving_impls.py"
# What the hanging plug-in is given: the fresh interpreter's start, torch's import and the plug-in's own (13 s at
# a load of 5 on 2 cores) with room to spare. The message quotes the line the plug-in prints once
# called, so a limit cut short by a slow start fails the test instead of passing it.
HANG_LIMIT_S = 30
SLEEPING = "test_sleeps: called, sleeping for an hour"  # tests/plugins/misbehaving_impls.py's
# Through the command line, what is judged is --plugin-seconds reaching the limit and the doctor going on (the cut
# within the call itself is the test above's): a limit that may end the child before the call is enough.
CLI_HANG_LIMIT_S = 15


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
    names = ["test_sys_exit", "test_sleeps", "test_wrong"]
    found = {c.name: c for c in isolated.checks(names, "cpu", plugins, limit_s=HANG_LIMIT_S)}
    assert all(
        found[f"agreement: {n}"].result is Result.FAIL for n in ("test_sys_exit", "test_sleeps", "test_wrong")
    ), found
    assert "ended (exit code 0)" in found["agreement: test_sys_exit"].detail
    hung = found["agreement: test_sleeps"].detail
    assert f"did not finish within {HANG_LIMIT_S} s" in hung and SLEEPING in hung, hung  # cut in the call itself
    assert "float64: max rel err" in found["agreement: test_wrong"].detail
    assert found["peak = predicted: test_wrong"].result is Result.PASS


@pytest.mark.slow
def test_doctor_with_a_plugin_that_exits_fails_naming_it():
    result = _topk_bench("doctor", "--plugins", MISBEHAVING, "--plugin-seconds", CLI_HANG_LIMIT_S, timeout=1200)
    assert result.returncode == 1, result.stdout + result.stderr
    failed = [line for line in result.stdout.splitlines() if "checks failed" in line]
    assert failed and all(f"agreement: {n}" in failed[0] for n in ("test_os_exit", "test_sys_exit", "test_sleeps"))
    assert "agreement: vanilla" in result.stdout  # the others still ran
    assert f"did not finish within {CLI_HANG_LIMIT_S} s" in result.stdout  # the hanging one, after its time
