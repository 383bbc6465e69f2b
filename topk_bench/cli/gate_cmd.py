"""``topk-bench gate``: the CPU time gate; exit 0 passed, 1 failed, 2 bad input."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from topk_bench.cli import Command, app
from topk_bench.gate.gate import BLOCK_TIMEOUT_S, FACTOR, MAX_ROUNDS, ROUNDS


@app.command("gate", cls=Command)
def gate(
    base: str | None = typer.Option(
        None, "--base", metavar="REV", help="The base revision (default: the commit in baselines/time-gate-base)."
    ),
    suite: Path | None = typer.Option(
        None, "--suite", metavar="SUITE", help="The suite measured (default: the repository's suites/ci_time.toml)."
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        metavar="DIR",
        help="Keep every block's rows and verdict.json in this new (or empty) directory (default: a temporary one).",
    ),
    rounds: int = typer.Option(
        ROUNDS, "--rounds", metavar="N", help="Rounds a side in the first look, and added by each later one (even)."
    ),
    max_rounds: int = typer.Option(
        MAX_ROUNDS,
        "--max-rounds",
        metavar="N",
        help="Rounds a side at most: a case still undecided then fails as 'could not judge: too noisy'.",
    ),
    time_factor: float = typer.Option(
        FACTOR, "--time-factor", metavar="F", help="A case fails when it slowed by more than this."
    ),
    block_timeout: float = typer.Option(
        BLOCK_TIMEOUT_S,
        "--block-timeout",
        metavar="S",
        help="Seconds a block (one side's `topk-bench run`) may take before it is killed and the gate fails.",
    ),
    judge: tuple[Path, Path] | None = typer.Option(
        None,
        "--judge",
        metavar="BASE NEW",
        help="Judge two runs already made (CSVs, or the BASE/ and NEW/ folders of a gate's --out): no measuring.",
    ),
) -> None:
    """The CPU time gate: suites/ci_time.toml measured with the base revision's code (a temporary git worktree)
    and this checkout's, in interleaved rounds on this machine, each case judged by its CPU time in each round;
    more rounds while a case is undecided, up to --max-rounds (docs/regression.md, "The CPU time gate")."""
    from topk_bench.gate import gate as the_gate  # imported here: `topk-bench --help` stays fast

    options = the_gate.Options(
        suite=suite,
        base=base,
        out=out,
        rounds=rounds,
        max_rounds=max_rounds,
        factor=time_factor,
        block_timeout_s=block_timeout,
        judge=judge,
    )
    code = the_gate.run(options, Path.cwd(), say=lambda line: print(line, flush=True))
    sys.exit(code)
