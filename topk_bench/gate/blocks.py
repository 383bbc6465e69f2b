"""The time gate's measuring: blocks of interleaved rounds of its suite, each one ``topk-bench run`` with one
side's code (BASE's worktree, or this checkout: NEW), in the order that keeps a drifting machine fair to both.

Each block is a child process with a bound (``timeout_s``): a side whose command hangs is killed with its
process group and fails the gate with a line saying so. A block's rows must be complete: every case ``ok``
and timed, the same cases as the other side's, BASE's naming the base commit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from topk_bench.measure import slowdown
from topk_bench.results import columns as col
from topk_bench.results.frame import left_out, load_results
from topk_bench.status import Status

BASE, NEW = "BASE", "NEW"


class Failed(Exception):
    """A side could not be measured in full: the gate fails (exit 1) with this line."""


@dataclass(frozen=True)
class Side:
    """One revision the gate measures: its name (BASE or NEW), the tree its code is imported from, and, for
    BASE, the commit its rows must name."""

    name: str
    tree: Path
    sha: str | None = None

    def env(self) -> dict[str, str]:
        """The environment of this side's runs: its tree first on the path (its ``topk_bench`` and attention
        code, whatever is installed); the test slowdown for NEW only (topk_bench/measure/slowdown.py)."""
        env = dict(os.environ)
        if self.name != NEW:
            env.pop(slowdown.VARIABLE, None)
        env["PYTHONPATH"] = os.pathsep.join([str(self.tree), *filter(None, [env.get("PYTHONPATH")])])
        return env


# Rounds in a block: the fewest that give a time per round in one ``topk-bench run`` (each costs its start:
# Python, torch, the child template, as much as a round of the suite's cases on a busy two-core runner).
BLOCK_ROUNDS = 2


def order(rounds: int) -> list[tuple[str, int]]:
    """One look's runs, in order: blocks of :data:`BLOCK_ROUNDS` rounds, ``rounds`` a side, in quartets BASE,
    NEW, NEW, BASE then NEW, BASE, BASE, NEW (a drift of the machine that is linear over a quartet falls on both
    sides alike). Many small blocks rather than two large ones a side: the rounds of one run share its child
    template and its minute of the machine, so that a run's rounds move together; measured at a load of 1.5 per
    core, the blocks of one side differed by up to a third where the rounds of one block differed by 5 to 10%."""
    sequence = []
    for i in range(rounds // BLOCK_ROUNDS):
        first, second = (BASE, NEW) if i % 4 in (0, 3) else (NEW, BASE)
        sequence += [(first, BLOCK_ROUNDS), (second, BLOCK_ROUNDS)]
    return sequence


def run_block(side: Side, suite: Path, rounds: int, out: Path, timeout_s: float) -> pd.DataFrame:
    """``rounds`` interleaved rounds of ``suite`` measured on the CPU with ``side``'s code into ``out``: its rows."""
    command = [sys.executable, "-m", "topk_bench", "run", str(suite), "--out", str(out), "--rounds", str(rounds)]
    command += ["--device", "cpu", "--no-resume", "--quiet"]
    with subprocess.Popen(
        command, cwd=side.tree, env=side.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group: a hung block is killed whole, cases included
    ) as process:  # fmt: skip
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            raise Failed(
                f"{side.name}'s run did not end in {timeout_s:.0f} s (--block-timeout): killed with its cases"
            ) from None
        except BaseException:  # a termination of the gate ends the block too
            _kill_group(process)
            raise
    csvs = sorted(out.glob("*.csv"))  # OUT/<the suite's name>.csv
    if process.returncode != 0 or len(csvs) != 1:
        last = (stderr.strip() or stdout.strip() or "no output").splitlines()[-1]
        raise Failed(f"{side.name} could not be measured (exit {process.returncode}): {last}")
    return read(csvs[0])


def read(csv: Path) -> pd.DataFrame:
    """A block's rows as the project's reader gives them: every cell text, the lines it left out (a cut line, an
    unknown status) in ``attrs`` for :func:`problems` to fail on."""
    frame = load_results(csv)
    dropped = frame.attrs.get("dropped", [])
    frame = frame.astype(str).replace({"nan": "", "None": ""})
    frame.attrs["dropped"] = dropped
    return frame


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def problems(side: Side, frame: pd.DataFrame, cases: set[str] | None) -> list[str]:
    """Why a block's rows cannot be judged: a line the reader left out, a case not ``ok`` or untimed, a case set
    other than ``cases`` (the first block's), BASE's rows not naming its commit."""
    found = [f"{side.name} {line}" for line in left_out(frame)]
    for _, row in frame.iterrows():
        if str(row[col.STATUS]) != Status.OK or not str(row.get(col.TIMES_S, "")).strip():
            error = str(row.get(col.ERROR, ""))[:200]
            found.append(f"{side.name} {row[col.WORKLOAD]}/{row[col.IMPL]} is {row[col.STATUS]}: {error}")
    if cases is not None:
        lacking = cases ^ set(frame[col.CASE_ID])
        if lacking:
            found.append(f"{len(lacking)} case(s) on one side only: {', '.join(sorted(lacking))}")
    if side.sha is not None:
        shas = {str(s).removesuffix("-dirty") for s in frame[col.GIT_SHA]}
        if shas != {side.sha}:
            found.append(f"{side.name}'s rows name commit(s) {', '.join(sorted(shas))}, not {side.sha[:12]}")
    return found
