"""``topk-bench gate``: the run of the CPU time gate, look after look until every case is decided or the bound.

One look measures the suite in four blocks (:func:`topk_bench.gate.blocks.order`) and judges every case on all
the rounds so far (:mod:`topk_bench.gate.judge`). While a case is undecided and the bound (``max_rounds`` a side)
is not reached, another look adds as many rounds again: a quiet machine decides in one look, a busy one measures
longer, and a case the bound leaves undecided fails as "could not judge: too noisy", with its numbers. The
outcome is printed, and kept as ``verdict.json`` (and every block's rows) in ``--out``.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from topk_bench.errors import BadInput
from topk_bench.gate import blocks, judge, worktree
from topk_bench.gate.blocks import BASE, NEW, Failed, Side
from topk_bench.gate.judge import CaseVerdict, Decision
from topk_bench.report.texttable import TextTable
from topk_bench.results import columns as col
from topk_bench.results import trust
from topk_bench.units import short_seconds

SUITE = Path("suites") / "ci_time.toml"
BASE_FILE = Path("baselines") / "time-gate-base"
# The tolerance: a case fails when it slowed by more than this, as best its rounds tell.
FACTOR = 1.2
# Rounds a side in the first look, and added by each later one; at most MAX_ROUNDS a side in all. A case's time
# moves by 10 to 20% (log sd) from round to round on two shared cores; at 40 rounds a side the interval of an
# unchanged case lies below x1.2 but for about 1 case in 100 (docs/regression.md, "The CPU time gate").
ROUNDS = 8
MAX_ROUNDS = 40
# A block that has not ended after this long is killed: a side whose command hangs fails the gate.
BLOCK_TIMEOUT_S = 900.0


@dataclasses.dataclass(frozen=True)
class Options:
    suite: Path | None = None  # default: SUITE in the repository
    base: str | None = None  # default: the hash in BASE_FILE
    out: Path | None = None  # default: a new temporary folder
    rounds: int = ROUNDS
    max_rounds: int = MAX_ROUNDS
    factor: float = FACTOR
    block_timeout_s: float = BLOCK_TIMEOUT_S
    judge: tuple[Path, Path] | None = None  # judge two runs already made (no measuring)

    def check(self) -> None:
        if self.rounds < 4 or self.rounds % 2:
            raise BadInput(f"expected an even number >= 4, got {self.rounds} (two blocks a side)", key="--rounds")
        if self.max_rounds < self.rounds:
            raise BadInput(f"expected at least --rounds ({self.rounds}), got {self.max_rounds}", key="--max-rounds")
        if not 1 < self.factor < 10:
            raise BadInput(f"expected a factor between 1 and 10, got {self.factor}", key="--time-factor")
        if not self.block_timeout_s > 0:
            raise BadInput(f"expected seconds > 0, got {self.block_timeout_s}", key="--block-timeout")


@dataclasses.dataclass
class Outcome:
    """What the gate found: the verdicts (empty when it could not judge), why it could not, what it measured."""

    verdicts: list[CaseVerdict]
    failure: str = ""
    frames: dict[str, list[pd.DataFrame]] = dataclasses.field(default_factory=lambda: {BASE: [], NEW: []})
    rounds: dict[str, int] = dataclasses.field(default_factory=lambda: {BASE: 0, NEW: 0})

    @property
    def passed(self) -> bool:
        return not self.failure and bool(self.verdicts) and all(v.decision.passes for v in self.verdicts)


Say = Callable[[str], None]


def measure(root: Path, base: Side, suite: Path, out: Path, options: Options, say: Say) -> Outcome:
    """Looks of ``options.rounds`` rounds a side until no case is undecided or ``options.max_rounds``."""
    sides = {BASE: base, NEW: Side(NEW, root)}
    outcome, cases, number = Outcome([]), None, 0
    while True:
        for name, count in blocks.order(options.rounds):
            number += 1
            frame = blocks.run_block(sides[name], suite, count, out / name / str(number), options.block_timeout_s)
            found = blocks.problems(sides[name], frame, cases)
            if found:
                raise Failed("cannot judge every case: " + "; ".join(found))
            cases = set(frame[col.CASE_ID]) if cases is None else cases
            outcome.frames[name].append(frame)
            outcome.rounds[name] += count
        outcome.verdicts = verdicts_of(outcome.frames, options.factor)
        undecided = [v for v in outcome.verdicts if v.decision is Decision.UNDECIDED]
        if not undecided or outcome.rounds[BASE] >= options.max_rounds:
            return outcome
        names = ", ".join(f"{v.name} {v.shift_text()}" for v in undecided)
        done = outcome.rounds[BASE]
        say(f"time gate: after {done} rounds a side, {len(undecided)} undecided ({names}): {options.rounds} more")


def verdicts_of(frames: dict[str, list[pd.DataFrame]], factor: float) -> list[CaseVerdict]:
    """Every case judged on both sides' rounds so far; Failed when a case has no time per round on a side (the
    gate never passes a case it could not judge)."""
    rounds = {side: judge.rounds_of(frames[side]) for side in (BASE, NEW)}
    lacking = [f"{side} {c.name}: {c.why_none}" for side, found in rounds.items() for c in found if not c.times]
    if lacking:
        raise Failed("cannot judge every case by its rounds: " + "; ".join(lacking))
    return judge.judge(rounds[BASE], rounds[NEW], factor)


def run(options: Options, cwd: Path, say: Say = print) -> int:
    """The gate, as ``topk-bench gate`` runs it: 0 passed, 1 failed (a regression, a case it could not judge, a
    side it could not measure); bad input raises :class:`~topk_bench.errors.BadInput` before anything is measured."""
    options.check()
    started = time.monotonic()
    if options.judge is not None:
        outcome = judged_files(options)
        return report(outcome, options, f"time gate ({time.monotonic() - started:.0f} s)", None, say)
    root = worktree.repository_root(cwd)
    try:
        suite = resolved_suite(options.suite, root, cwd)
        kind = cpu_kind()
    except BadInput:
        raise
    except Exception as error:  # noqa: BLE001 -- this checkout's code is broken: its runs could not start either
        failure = f"this checkout's code cannot read the suite: {type(error).__name__}: {error}"
        return report(Outcome([], failure), options, "time gate", None, say)
    sha = worktree.base_revision(root, options.base, root / BASE_FILE)
    out = output_folder(options.out, cwd)
    for stale in worktree.remove_stale(root):
        say(f"time gate: removed the worktree of an earlier gate that did not end: {stale}")
    say(f"time gate: {suite.name}, BASE {sha[:12]} against NEW (this checkout), {options.rounds} rounds a side a "
        f"look, at most {options.max_rounds}, CPU kind {kind}, into {out}")  # fmt: skip
    try:
        with worktree.terminations_raise(), worktree.checkout(root, sha) as tree:
            outcome = measure(root, Side(BASE, tree, sha), suite, out, options, say)
    except Failed as error:
        outcome = Outcome([], str(error))
    except worktree.Terminated as stop:
        say(f"time gate: {stop}: the base worktree was removed")
        return 128 + stop.signum
    write_verdict(out / "verdict.json", outcome, options, sha, head(root), kind)
    return report(outcome, options, f"time gate (CPU kind {kind}, {time.monotonic() - started:.0f} s)", out, say)


def resolved_suite(given: Path | None, root: Path, cwd: Path) -> Path:
    """The suite's absolute path (BASE's run starts in its worktree): ``given`` from the working directory, else
    the repository's gate suite; planned here as each block's run plans it, so that a suite that does not read is
    bad input before anything runs."""
    suite = (cwd / given) if given is not None else root / SUITE
    if not suite.is_file():
        raise BadInput("no such suite file", file=str(given if given is not None else SUITE))
    from topk_bench.run.plan import plan
    from topk_bench.run.resolve import Flags

    plan(suite, Flags(device="cpu"))
    return suite.resolve()


def output_folder(given: Path | None, cwd: Path) -> Path:
    """Where the blocks and the verdict go: ``given`` (from the working directory: BASE's runs start elsewhere),
    new or empty; else a new temporary folder."""
    if given is None:
        return Path(tempfile.mkdtemp(prefix="topk-bench-time-gate-"))
    out = (cwd / given).resolve()
    if out.exists() and not out.is_dir():
        raise BadInput("is a file: the gate measures into a new directory", file=str(given))
    if out.is_dir() and any(out.iterdir()):
        raise BadInput("is not empty: the gate measures into a new directory", file=str(given))
    out.mkdir(parents=True, exist_ok=True)
    return out


def cpu_kind() -> str:
    from topk_bench.measure import metadata

    return metadata.cpu_kind(metadata.cpu_capability(), metadata.cpu_flags())


def head(root: Path) -> str:
    found = worktree.git(root, "rev-parse", "HEAD")
    return found.stdout.strip() if found.returncode == 0 else ""


def judged_files(options: Options) -> Outcome:
    """``--judge BASE NEW``: two sides' runs already made (a CSV, or a folder of the blocks' CSVs, as ``--out``
    keeps them), judged as the last look would judge them."""
    assert options.judge is not None
    frames: dict[str, list[pd.DataFrame]] = {}
    for name, path in zip((BASE, NEW), options.judge):
        csvs = sorted(path.rglob("*.csv")) if path.is_dir() else [path] if path.is_file() else []
        if not csvs:
            raise BadInput("no such CSV, nor a folder holding one", file=str(path))
        frames[name] = [blocks.read(csv) for csv in csvs]
    outcome = Outcome([], frames=frames)
    found = [p for name in (BASE, NEW) for f in frames[name] for p in blocks.problems(Side(name, Path()), f, None)]
    if found:
        outcome.failure = "cannot judge every case: " + "; ".join(found)
        return outcome
    try:
        outcome.verdicts = verdicts_of(frames, options.factor)
    except Failed as error:
        outcome.failure = str(error)
        return outcome
    outcome.rounds = {name: max((len(v.base if name == BASE else v.new) for v in outcome.verdicts), default=0)
                      for name in (BASE, NEW)}  # fmt: skip
    return outcome


def write_verdict(path: Path, outcome: Outcome, options: Options, base: str, new: str, kind: str) -> None:
    """``verdict.json``: the outcome for the report's history and for scripts (docs/CONTRACTS.md)."""
    cases = [
        {
            "case_id": v.case_id,
            "name": v.name,
            "verdict": v.decision.value,
            "estimate": v.shift.estimate,
            "low": v.shift.low,
            "high": v.shift.high if v.shift.high != float("inf") else None,
            "base_s": list(v.base),
            "new_s": list(v.new),
        }
        for v in outcome.verdicts
    ]
    body = {
        "passed": outcome.passed,
        "failure": outcome.failure,
        "base": base,
        "new": new,
        "cpu_kind": kind,
        "factor": options.factor,
        "confidence": judge.CONFIDENCE,
        "rounds": outcome.rounds,
        "cases": cases,
    }
    path.write_text(json.dumps(body, indent=2) + "\n")


def report(outcome: Outcome, options: Options, head_line: str, out: Path | None, say: Say) -> int:
    """The verdicts' table and the gate's last line; its exit code."""
    if outcome.verdicts:
        say("\n".join(table(outcome.verdicts).lines()))
    kept = f" (kept in {out})" if out is not None else ""
    if outcome.failure:
        say(f"{head_line}: FAILED: {outcome.failure}{kept}")
        return 1
    if not outcome.verdicts:
        say(f"{head_line}: FAILED: no case was judged: the runs hold no timed case{kept}")
        return 1
    counts = {d: sum(v.decision is d for v in outcome.verdicts) for d in Decision}
    summary = ", ".join(f"{n} {d.value}" for d, n in counts.items() if n)
    rounds = f"{outcome.rounds[BASE]} rounds a side"
    if outcome.passed:
        say(f"{head_line}: passed: {len(outcome.verdicts)} case(s) judged in {rounds}: {summary}")
        return 0
    say(f"{head_line}: FAILED: {summary}, in {rounds}{kept}")
    for v in outcome.verdicts:
        if v.decision is Decision.REGRESSED:
            say(f"  {v.name}: regressed beyond x{options.factor}: {v.numbers()}; {trust_seen(outcome, v)}")
        elif v.decision is Decision.UNDECIDED:
            say(f"  {v.name}: could not judge: too noisy after {rounds}, the rounds cannot tell whether it slowed "
                f"by x{options.factor}: {v.numbers()}; {trust_seen(outcome, v)}")  # fmt: skip
    return 1


def table(verdicts: list[CaseVerdict]) -> TextTable:
    rows = [
        (v.name, _spread(v.base), _spread(v.new), f"x{v.shift.estimate:.3f}",
         f"x{v.shift.low:.3f} - x{v.shift.high:.3f}", v.decision.value)
        for v in verdicts
    ]  # fmt: skip
    columns = ("case", "BASE rounds", "NEW rounds", "change", "95% interval", "verdict")
    return TextTable("", columns, (False, True, True, True, True, False), rows)


def _spread(times: tuple[float, ...]) -> str:
    """``4.12 ms - 5.03 ms``: the fastest round and the slowest."""
    return f"{short_seconds(min(times))} - {short_seconds(max(times))}"


def trust_seen(outcome: Outcome, verdict: CaseVerdict) -> str:
    """The trust flags the case's rows carried on each side (any block), for the failing case's line."""
    parts = []
    for side in (BASE, NEW):
        flags = {
            flag
            for frame in outcome.frames.get(side, [])
            for cell in frame.loc[frame[col.CASE_ID] == verdict.case_id, col.TRUST]
            for flag in trust.named(cell)
        }
        parts.append(f"{side} rows {','.join(f for f in trust.FLAGS if f in flags) or 'unflagged'}")
    return "; ".join(parts)
