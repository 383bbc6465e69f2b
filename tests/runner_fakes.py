"""A stand-in for ``run_isolated`` in runner tests: fast, scripted statuses, and a record of what ran.

Also a script (``python tests/runner_fakes.py SUITE OUT DELAY [--no-resume]``) that runs a suite with it,
for tests that interrupt a real process (SIGINT, SIGKILL) in the middle of a run.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from topk_bench.case import Budget, Case, Measurement
from topk_bench.run.resolve import Flags

# A file that the scripted run (``main``) appends each finished case's id to, when set.
MARK_VARIABLE = "TOPK_BENCH_FAKE_MARKS"


def interruptible() -> None:
    """``preexec_fn`` of a process a test interrupts: SIGINT as in a foreground process. A background
    job of a non-interactive shell (``make test &``) inherits SIGINT ignored, and Python then installs
    no KeyboardInterrupt handler: the test's SIGINT would interrupt nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


SUITE = """
name = "{name}"
workload = "mha"
causal = true
[shape]
d_model = 8
heads = 2
[sweep]
seq_len = [16, 32, 64, 128]
[[impl]]
name = "vanilla"
[[impl]]
name = "qchunk"
chunk_size = 8
"""


def write_suite(directory: Path, name: str = "fake", text: str = SUITE) -> Path:
    path = directory / f"{name}.toml"
    path.write_text(text.format(name=name))
    return path


class FakeRun:
    """``run(case, budget) -> Measurement``; ``status(case)`` scripts the outcome, ``ran`` records the cases."""

    def __init__(
        self,
        status: Callable[[Case], str] = lambda case: "ok",
        delay_s: float = 0.0,
        extra: Callable[[Case], dict] = lambda case: {},
    ):
        self.status, self.delay_s, self.extra = status, delay_s, extra
        self.ran: list[Case] = []
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def __call__(self, case: Case, budget: Budget) -> Measurement:
        with self._lock:
            self.ran.append(case)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            time.sleep(self.delay_s)
            status = self.status(case)
            length = case.param_dict.get("seq_len", 1)
            ok = status == "ok"
            return Measurement(
                status=status,
                error="" if ok else f"scripted {status}",
                peak_bytes=length * 1000 if ok else None,
                baseline_bytes=100 if ok else None,
                times_s=[0.001 * length, 0.002 * length, 0.003 * length] if ok else [],
                device_name="fake cpu",
                metadata={"torch_version": "fake", "git_sha": "abc"},
                extra=self.extra(case),
            )
        finally:
            with self._lock:
                self.active -= 1
                if os.environ.get(MARK_VARIABLE):  # a test in another process follows the cases as they end
                    with open(os.environ[MARK_VARIABLE], "a") as marks:
                        marks.write(case.case_id + "\n")


def main(suite: str, out: str, delay_s: str, *flags: str) -> None:
    """``flags``: ``--no-resume`` measures every case again."""
    from topk_bench.run import runner
    from topk_bench.run.executors import LocalExecutor

    try:
        runner.run(
            suite,
            Flags(out=out, device="cpu"),
            progress=False,
            resume="--no-resume" not in flags,
            executor_obj=LocalExecutor(run=FakeRun(delay_s=float(delay_s))),
        )
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main(*sys.argv[1:])
