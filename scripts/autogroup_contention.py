"""Why a spinning process per core can leave a case's ``cpu_wait`` at zero (docs/CONTRACTS.md, "contended").

A 512x512 matrix product timed in a child process on one thread and on two, first alone and then against
one spinning process per core started from this session; the child in a session of its own (as the harness
runs each case) and in this session. Printed: the median time and the ``cpu_wait`` / ``cpu_share`` the
harness's sampler reads. With Linux's autogroups (``/proc/sys/kernel/sched_autogroup_enabled`` = 1) the CPU is
shared between sessions before threads.

    .venv/bin/python scripts/autogroup_contention.py
"""

import json
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, sys, time, torch
from topk_bench.measure.contention import Sampler
threads = int(sys.argv[1])
torch.set_num_threads(threads)
a = torch.randn(512, 512)
for _ in range(3): a @ a
s = Sampler(threads); ts = []
for _ in range(15):
    with s.around():
        t = time.perf_counter(); a @ a; ts.append(time.perf_counter() - t)
ts.sort(); sm = s.summary()
print(json.dumps((ts[7] * 1e3, sm["cpu_wait"], sm["cpu_share"])))
"""


def child(threads: int, session: bool) -> tuple[float, float, float]:
    command = [sys.executable, "-c", CHILD, str(threads)]
    done = subprocess.run(command, capture_output=True, text=True, start_new_session=session, check=True)
    return tuple(json.loads(done.stdout))


print(f"sched_autogroup_enabled: {Path('/proc/sys/kernel/sched_autogroup_enabled').read_text().strip()}")
for threads in (1, 2):
    for session in (True, False):
        alone = child(threads, session)
        spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
        time.sleep(0.5)
        try:
            loaded = child(threads, session)
        finally:
            for p in spinners:
                p.kill()
                p.wait()
        print(
            f"{threads} thread(s), {'a session of its own' if session else 'the spinners session'}: "
            f"alone {alone[0]:.2f} ms, cpu_wait {alone[1]:.2f}; against the spinners {loaded[0]:.2f} ms "
            f"({loaded[0] / alone[0]:.1f}x), cpu_wait {loaded[1]:.2f}, cpu_share {loaded[2]:.2f}"
        )
