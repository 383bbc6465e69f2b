"""Why a spinning process per core can leave a case's ``cpu_wait`` at zero (docs/CONTRACTS.md, "contended").

A matrix product timed in a child process, as the harness does (a session of its own), first alone and then
against one spinning process per core started from this session, and again with the child in this session:
the median time and the ``cpu_wait`` / ``cpu_share`` the harness's sampler reads. With Linux's autogroups
(``/proc/sys/kernel/sched_autogroup_enabled`` = 1) the CPU is shared between sessions before threads: a
one-thread step in a session of its own gets a whole core whatever the spinners do, and is not slowed.

    .venv/bin/python scripts/autogroup_contention.py
"""

import json
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import time, torch, json, sys
from topk_bench.measure.contention import Sampler
torch.set_num_threads(2)
out = {}
for n in (64, 512):
    a = torch.randn(n, n)
    for _ in range(3): a @ a
    s = Sampler(2); ts = []
    for _ in range(15):
        with s.around():
            t = time.perf_counter(); a @ a; ts.append(time.perf_counter() - t)
    ts.sort(); sm = s.summary(); out[n] = (ts[7] * 1e3, sm["cpu_wait"], sm["cpu_share"])
print(json.dumps(out))
"""


def child(session):
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, start_new_session=session)
    return json.loads(r.stdout)


print(f"sched_autogroup_enabled: {Path('/proc/sys/kernel/sched_autogroup_enabled').read_text().strip()}")
for child_session in (True, False):
    quiet = child(child_session)
    sp = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    time.sleep(0.5)
    try:
        loaded = child(child_session)
    finally:
        for p in sp:
            p.kill()
            p.wait()
    for n in quiet:
        (q_ms, q_wait, _), (l_ms, l_wait, l_share) = quiet[n], loaded[n]
        print(
            f"case in a session of its own={child_session} n={n}: alone {q_ms:.2f} ms, cpu_wait {q_wait:.2f}; "
            f"against the spinners {l_ms:.2f} ms ({l_ms / q_ms:.1f}x), cpu_wait {l_wait:.2f}, cpu_share {l_share:.2f}"
        )
