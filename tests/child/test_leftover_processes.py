"""Processes a case started are killed with it and said in its row."""

from __future__ import annotations

from pathlib import Path

import pytest

# --- processes a case leaves behind --------------------------------------------------------------------

SPAWNER = '''
import os, subprocess, time
from pathlib import Path
from topk_bench import attention
from topk_bench.attention import Implementation

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


attention.register(Implementation("spawner", spawn, "starts processes", options={"hang": 0},
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
    case = Case.make(
        suite="t",
        workload="mha",
        impl="spawner",
        params={"seq_len": 8, "d_model": 8, "heads": 2},
        options={"hang": hang},
        mode="fwd",
        warmup=0,
        repeats=1,
        plugins=(str(plugin),),
    )
    try:
        result = run_isolated(case, Budget(max_seconds=5 if hang else 120))
        pids = [int(p) for p in plugin.with_suffix(".pids").read_text().split()]
        assert len(pids) == 3
        assert result.status == ("timeout" if hang else "ok"), result.error
        assert not [p for p in pids if _alive(p)], "processes outlived their case"
        assert f"killed {named} process(es) the case left running" in result.error and "sleep" in result.error, (
            result.error
        )
    finally:
        for pid in (
            [int(p) for p in plugin.with_suffix(".pids").read_text().split()]
            if plugin.with_suffix(".pids").exists()
            else []
        ):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
