"""Test-only attention implementations that fail on purpose, one per failure status.

Imported by the worker through ``Case.plugins`` (as a file path), so they exist
only in the child process that measures them.
"""

from __future__ import annotations

import os
import time

import torch

import topk_bench.attention
from topk_bench.attention import Implementation


def hog(q, k, v, *, causal=False, activation="softmax", nbytes=256 << 20):
    """Allocates (and touches) ``nbytes`` beside the output: past any small memory budget."""
    ballast = torch.ones(nbytes // 4, dtype=torch.float32)
    return q + ballast[:1]


def huge(q, k, v, *, causal=False, activation="softmax"):
    """Asks the allocator for 4 EiB: the allocation itself fails."""
    torch.empty(1 << 62, dtype=torch.uint8)
    return q


def fail(q, k, v, *, causal=False, activation="softmax"):
    raise ValueError("test_raise failed on purpose")


def sleepy(q, k, v, *, causal=False, activation="softmax", seconds=60.0, pid_file=""):
    """Sleeps past any small time budget; writes its process id first when asked (to check it is gone later)."""
    if pid_file:
        with open(pid_file, "w") as f:
            f.write(str(os.getpid()))
    time.sleep(seconds)
    return q


def abort(q, k, v, *, causal=False, activation="softmax"):
    os.abort()


def leave(q, k, v, *, causal=False, activation="softmax"):
    os._exit(3)  # no result, no traceback


def opaque(q, k, v, *, causal=False, activation="softmax"):
    return q.clone()


_IMPLS = [
    Implementation("test_hog", hog, "allocates past the budget", options={"nbytes": 256 << 20}),
    Implementation("test_huge", huge, "allocation failure"),
    Implementation("test_raise", fail, "raises ValueError"),
    Implementation("test_sleep", sleepy, "sleeps past the time budget", options={"seconds": 60.0, "pid_file": ""}),
    Implementation("test_exit", leave, "exits the process with code 3"),
    Implementation("test_abort", abort, "calls os.abort()"),
    Implementation("test_unpredictable", opaque, "declared not predictable", predictable=False),
]

for _impl in _IMPLS:
    if _impl.name not in topk_bench.attention.names():  # idempotent: also imported by tests directly
        topk_bench.attention.register(_impl)
