"""Test-only implementations whose code ends or hangs the process that calls them (issue 29's red team):
``topk-bench doctor --plugins`` must fail them by name, not exit 0 or hang."""

from __future__ import annotations

import os
import sys
import time

from topk_bench import attention
from topk_bench.attention import Implementation

SLEEPING = "test_sleeps: called, sleeping for an hour"


def exits_at_once(q, k, v, *, causal=False, activation="softmax"):
    os._exit(0)


def raises_system_exit(q, k, v, *, causal=False, activation="softmax"):
    sys.exit(0)


def sleeps(q, k, v, *, causal=False, activation="softmax"):
    print(SLEEPING, flush=True)  # the doctor's message quotes it: the hang it cut was this call's
    time.sleep(3600)
    return q


for _impl in (
    Implementation("test_os_exit", exits_at_once, "calls os._exit(0)", predictable=False),
    Implementation("test_sys_exit", raises_system_exit, "calls sys.exit(0)", predictable=False),
    Implementation("test_sleeps", sleeps, "sleeps for an hour", predictable=False),
):
    if _impl.name not in attention.names():
        attention.register(_impl)
