"""Contention caught where it happens: what a case's threads got of the machine while timed.

With a real competing load (a CPU-spinning process on every core while the case runs with as many threads
as cores) every row the load slowed must be flagged ``contended``; the same case on a quiet machine must not
be. How much a spinner slows a case is the scheduler's choice, not the harness's (with Linux's autogroups the
case's process group gets its share whatever the spinners do), so the loaded test judges the rows the load
did slow, and skips, saying what it saw, when it slowed none. This
machine is shared: the quiet test watches the other processes' CPU time while the case runs (this test's
own process tree left out) and skips, saying how busy they kept the machine, when it cannot tell.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from locations import ROOT
from topk_bench import load_results, machine
from topk_bench.measure.contention import Sampler, procs_running, thread_waits
from topk_bench.results import trust
from topk_bench.run.resolve import Flags

REPO = ROOT
# Other processes may keep at most this many cores busy, on average, for a machine to count as quiet.
QUIET_CORES = 0.1

# The decode case of issue 29 (Llama-3-8B, one step over 1024 cached tokens, batch 1, topk_fast k=128) and two
# dense ones beside it: every row is a case the flag must get right.
DECODE_SUITE = """
name = "contention"
workload = "decode"
dtype = "bfloat16"
warmup = 3
repeats = 15
[shape]
new_tokens = 1
[sweep]
kv_len = [1024]
batch = [1]
model = ["llama-3-8b"]
[[impl]]
name = "topk_fast"
topk = 128
[[impl]]
name = "sdpa"
[[impl]]
name = "vanilla"
"""


def _run(tmp_path: Path, name: str):
    from topk_bench.run import runner

    suite = tmp_path / "contention.toml"
    suite.write_text(DECODE_SUITE)
    result = runner.run(
        suite,
        Flags(out=tmp_path / name, device="cpu", threads=machine.cores(), max_case_seconds=300),
        progress=False,
        resume=False,
    )
    rows = load_results(result.csv_path)
    assert list(rows["status"]) == ["ok"] * 3, list(rows["error"])
    return rows


def _spinners(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def _autogroup() -> str:
    """Linux's ``sched_autogroup_enabled``: on, a process group shares the CPU with the spinners' group
    as a whole, however many threads either runs."""
    try:
        return "on" if Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1" else "off"
    except OSError:
        return "unknown"


def _stop(processes: list[subprocess.Popen]) -> None:
    for p in processes:
        p.kill()
        p.wait()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_row_of_a_case_run_against_a_spinning_process_per_core_is_flagged_contended(tmp_path):
    """threads = cores and one spinning process per core: every row the spinners slowed by 2x or more must say
    so, whatever the load average said when the case started. A row they did not slow need not (a sub-ms step
    the scheduler runs on one thread as soon as it wakes: SDPA here, 0.85 ms, cpu_wait 0.00); the same cases
    run right after, the spinners stopped, tell which were slowed. When none was, there is nothing to judge:
    the test skips with the rows and the scheduler's autogroup setting (seen: 1.1x and 1.2x, cpu_wait 0.00,
    on a 2-core VM with autogroups on)."""
    spinners = _spinners(machine.cores())
    try:
        time.sleep(0.5)  # every spinner running before the first case starts
        rows = _run(tmp_path, "loaded")
    finally:
        _stop(spinners)
    after = _run(tmp_path, "after").set_index("impl")["time_median_s"]
    described = [
        f"{r.impl}: {r.time_median_s * 1e3:.2f} ms ({r.time_median_s / after[r.impl]:.1f}x the run "
        f"after), cpu_wait {r.cpu_wait:.2f}, trust {r.trust!r}"
        for r in rows.itertuples()
    ]
    slowed = [r.time_median_s >= 2 * after[r.impl] for r in rows.itertuples()]
    flagged = [trust.CONTENDED in trust.named(cell) for cell in rows["trust"]]
    assert (rows["threads"] == machine.cores()).all()
    # The machine's runnable threads, sampled while the case ran, saw the spinners whatever they slowed.
    assert (rows["runnable"] > trust.BUSY_LOAD_PER_CORE).all(), list(rows["runnable"])
    if not any(slowed):
        pytest.skip(
            f"the spinners slowed no case by 2x or more (autogroup {_autogroup()}), nothing to judge: {described}"
        )
    assert all(f for f, s in zip(flagged, slowed) if s), described


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_same_case_on_a_quiet_machine_is_not_flagged(tmp_path):
    """The same rows with nothing competing: none is contended. Skipped, with what was seen, when other
    processes kept more than a tenth of a core busy while the case ran (then the flag would be right)."""
    before = machine.others_busy(watch_s=2.0)
    if before is None:
        pytest.skip("this platform does not say how busy other processes keep the machine (/proc)")
    if before > QUIET_CORES:
        pytest.skip(
            f"the machine is too busy to tell: other processes kept {before:.2f} cores busy before the "
            f"case (a quiet machine: at most {QUIET_CORES})"
        )
    seen: list[float] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            value = machine.others_busy(watch_s=0.5, root=os.getpid())
            if value is not None:
                seen.append(value)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        rows = _run(tmp_path, "quiet")
    finally:
        done.set()
        watcher.join()
    during = sum(seen) / len(seen) if seen else 0.0
    if during > QUIET_CORES:
        pytest.skip(
            f"the machine is too busy to tell: other processes kept {during:.2f} cores busy on average "
            f"while the case ran (at most {QUIET_CORES}: quiet)"
        )
    described = [
        f"{r.impl}: {r.time_median_s * 1e3:.2f} ms, cpu_wait {r.cpu_wait:.3f}, trust {r.trust!r}"
        for r in rows.itertuples()
    ]
    assert not any(trust.CONTENDED in trust.named(cell) for cell in rows["trust"]), described
    assert (rows["cpu_wait"] < trust.CONTENDED_WAIT).all(), described


# ------------------------------------------------------------------------------- the readings themselves


def test_a_thread_kept_from_its_core_shows_its_wait_and_a_quiet_one_does_not():
    """One thread of this process pinned to one core with a spinning process pinned beside it: the sampler
    sees it wait for about half of the time; alone on its core it waits far less (this machine is shared,
    so "far less" is all that can be asserted, against the same core's other readings)."""
    if thread_waits() is None:
        pytest.skip("this kernel does not report run delay (/proc/self/task/*/schedstat)")
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    core = sorted(os.sched_getaffinity(0))[-1]
    rival = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"]
    )
    previous = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {core})  # this thread only: Linux's affinity is per thread
        time.sleep(0.3)
        sampler = Sampler(1)
        for _ in range(5):
            with sampler.around():
                end = time.perf_counter() + 0.1
                while time.perf_counter() < end:
                    pass
        shared = sampler.summary()
    finally:
        rival.kill()
        rival.wait()
        os.sched_setaffinity(0, previous)
    assert shared["cpu_wait"] > trust.CONTENDED_WAIT, shared
    assert shared["cpu_share"] < 0.75, shared
    assert shared["threads"] == 1 and shared["runnable"] is not None


def test_running_threads_are_read_from_loadavg(tmp_path):
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("2.82 2.39 1.95 8/140 16857\n")
    assert procs_running(loadavg) == 8
    loadavg.write_text("garbage\n")
    assert procs_running(loadavg) is None
    assert procs_running(tmp_path / "absent") is None


def test_a_sampler_that_timed_nothing_says_nothing():
    assert Sampler(4).summary() == {
        "threads": 4,
        "cpu_wait": None,
        "cpu_share": None,
        "preempt_per_s": None,
        "runnable": None,
    }


def _jiffies(pid: int) -> int:
    """utime + stime of one process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def test_others_busy_leaves_out_this_process_tree_and_sees_a_process_outside_it():
    """A spinning child of this process is ours (the template and the cases are too): its CPU time is in our
    tree's. The same spinner detached from us (its parent gone) is another's: others_busy counts it. Exact
    on a loaded machine too: each is compared with the spinner's own CPU time (to a few jiffies)."""
    if machine.others_busy(watch_s=0.1) is None:
        pytest.skip("this platform does not say how busy other processes keep the machine (/proc)")
    ticks = os.sysconf("SC_CLK_TCK")
    ours = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        tree, own = machine._process_tree_jiffies(os.getpid()), _jiffies(ours.pid)
        time.sleep(1.0)
        grew, spun = machine._process_tree_jiffies(os.getpid()) - tree, _jiffies(ours.pid) - own
    finally:
        ours.kill()
        ours.wait()
    # The two readings are a few microseconds apart at each end: a spinner's jiffy or two may fall between them.
    assert spun > 0 and grew >= spun - 3, (grew, spun)
    detached = subprocess.run(
        ["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(detached.stdout.strip())
    try:
        time.sleep(0.2)
        assert os.getpid() not in _ancestors(pid)
        own, start = _jiffies(pid), time.monotonic()
        seen = machine.others_busy(watch_s=1.0)
        spun, wall = _jiffies(pid) - own, time.monotonic() - start
    finally:
        os.kill(pid, signal.SIGKILL)
    assert spun > 0 and seen * wall * ticks >= spun - 5, (seen, spun)  # others may add to it, never less


def _ancestors(pid: int) -> set[int]:
    found = set()
    while pid > 1:
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        found.add(pid)
    return found


def test_auto_threads_are_the_cores_not_kept_busy():
    cores = machine.cores()
    assert machine.free_cores(0.0) == cores
    assert machine.free_cores(0.4) == cores
    assert machine.free_cores(cores + 3.0) == 1  # never none
    assert machine.free_cores(None) == cores
