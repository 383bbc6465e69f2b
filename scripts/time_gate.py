"""The CPU time gate of ``.ci/run``: this checkout's time regressions against a base revision, both measured here.

The base is a commit, ``baselines/time-gate-base`` (a file holding its hash, moved on purpose when the baseline is
refreshed: docs/regression.md, "The CPU time gate"). The gate checks that revision out in a temporary
``git worktree`` and measures ``suites/ci_time.toml`` (this checkout's) with BASE's code and with NEW's (this
checkout's) in interleaved rounds on this machine, BASE then NEW, NEW then BASE, and so on, one round of the suite
each, as ``asv continuous`` and tritonbench's ``--ab-repeat`` do. Each method's time is judged over SDPA's in the
same round (``compare --relative-to sdpa``): what a shared machine does to both divides out, and the two revisions
were measured minutes apart on the same CPU, so no CPU kind needs a baseline of its own and none goes unjudged.

- A case fails when its median ratio grew beyond the factor (:func:`failing`), whatever the Mann-Whitney test says
  (on a busy runner it cannot tell a real 1.3x from noise), or on a regression the test confirms.
- A failing case whose rows (or its SDPA's) were measured under contention (``trust``: ``busy`` or ``contended``)
  causes one re-measure of both revisions; what fails then fails, with the trust columns in the message:
  contention never passes a regression.
- BASE must give every case an ``ok`` row with its time, as NEW must: a failed, missing or partial reference fails.
- Only time and status are judged (a measured peak is the memory gate's: the predicted peaks of ``suites/ci.toml``).

The base worktree runs this venv's Python with the worktree first on ``PYTHONPATH``: its ``topk_bench`` and
``implementations`` are imported from there (its rows' ``git_sha`` is checked to be the base's), its native kernels
compile once per source hash, like NEW's. ``TOPK_BENCH_TEST_SLOWDOWN`` (tests only, topk_bench/measure/slowdown.py)
reaches NEW's cases alone.

Exit 0: passed; 1: a regression, or a side that could not be measured in full; 2: bad input (one line).

    python scripts/time_gate.py                          # what .ci/run does
    python scripts/time_gate.py --base HEAD~3            # against another revision
    python scripts/time_gate.py --judge BASE.csv NEW.csv # judge two runs already made (no measuring)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from topk_bench.errors import BadInput  # noqa: E402 -- after the checkout is on the path
from topk_bench.measure import metadata, slowdown  # noqa: E402
from topk_bench.report import compare, compare_render  # noqa: E402
from topk_bench.report.thresholds import Thresholds  # noqa: E402
from topk_bench.results import columns as col  # noqa: E402
from topk_bench.results import trust  # noqa: E402
from topk_bench.status import Status  # noqa: E402

SUITE = ROOT / "suites" / "ci_time.toml"
BASE_FILE = ROOT / "baselines" / "time-gate-base"
REFERENCE = "sdpa"
# The tolerance, from the run-to-run spread of this suite's per-case median ratio on the project's machines
# (docs/regression.md, "The CPU time gate"): three runs of unchanged code, no row contended, changed by at most
# x1.13 (sink_window, the shortest step), x1.04 for the others.
TIME_FACTOR = 1.2
# 7 rounds a side: one outlier round in either run raises the Mann-Whitney p of a clear 1.3x change to 0.011, so
# 0.01 would hide it; the factor above, not alpha, is what keeps the noise out.
ALPHA = 0.05
# Rounds a side, in two blocks (:func:`blocks`): 4 per-round ratios a side give the Mann-Whitney test a p of 0.029 at
# best, under alpha; a median ratio beyond the factor fails even where the test cannot confirm it (:func:`failing`).
ROUNDS = 4
# The rows' columns a failing case's message quotes: how far to trust the time, and why.
TRUST_COLUMNS = (col.TRUST, col.CPU_WAIT, col.RUNNABLE, col.LOAD_START)
# Columns of one round's row that differ round to round and are pooled (times) or summarised (the rest) when
# the rounds become one row.
POOLED = (col.TIMES_S, "fwd_times_s", "bwd_times_s")


class Failed(Exception):
    """A side could not be measured in full: the gate fails (exit 1) with this line."""


def one_line_error(message: str) -> None:
    print(f"time gate: error: {message}", file=sys.stderr)


def git(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def base_revision(given: str | None) -> str:
    """The base commit's full hash: ``--base`` if given, else the hash in ``baselines/time-gate-base``; BadInput
    naming the file or the flag when it is not a commit of this repository (a shallow clone lacks old ones)."""
    if given is None:
        where = str(BASE_FILE.relative_to(ROOT))
        try:
            text = BASE_FILE.read_text().strip()
        except OSError as error:
            raise BadInput(f"cannot read it ({error.strerror}): it holds the base commit's hash", file=where) from None
        given = text.split()[0] if text.split() else ""
    else:
        where = "--base"
    found = git("rev-parse", "--verify", "--quiet", f"{given}^{{commit}}") if given else None
    if found is None or found.returncode != 0:
        raise BadInput(
            f"{given!r} is not a commit of this repository (a shallow clone? git fetch --unshallow)", file=where
        )
    return found.stdout.strip()


@contextlib.contextmanager
def checkout(sha: str) -> Iterator[Path]:
    """The base revision in a temporary worktree, removed afterwards (and its administrative entry pruned)."""
    parent = Path(tempfile.mkdtemp(prefix="topk-bench-time-gate-base-"))
    tree = parent / "base"
    added = git("worktree", "add", "--detach", "--quiet", str(tree), sha)
    if added.returncode != 0:
        shutil.rmtree(parent, ignore_errors=True)
        raise Failed(f"cannot check out the base {sha[:12]}: {added.stderr.strip().splitlines()[-1:]}")
    try:
        yield tree
    finally:
        git("worktree", "remove", "--force", str(tree))
        shutil.rmtree(parent, ignore_errors=True)
        git("worktree", "prune")


def side_env(tree: Path) -> dict[str, str]:
    """The environment of one side's run: the tree's packages first on the path; the test slowdown for NEW only."""
    env = dict(os.environ)
    if tree != ROOT:
        env.pop(slowdown.VARIABLE, None)
        env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    return env


def measure_block(side: str, tree: Path, suite: Path, rounds: int, out: Path) -> pd.DataFrame:
    """``rounds`` interleaved rounds of the suite measured with ``tree``'s code into ``out``: its rows."""
    command = [sys.executable, "-m", "topk_bench", "run", str(suite), "--out", str(out), "--rounds", str(rounds)]
    command += ["--no-resume", "--quiet"]
    done = subprocess.run(command, cwd=tree, env=side_env(tree), capture_output=True, text=True)
    csvs = sorted(out.glob("*.csv"))  # OUT/<the suite's name>.csv
    if done.returncode != 0 or len(csvs) != 1:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise Failed(f"{side} could not be measured (exit {done.returncode}): {last}")
    return pd.read_csv(csvs[0], dtype=str, keep_default_na=False)


def pooled(blocks: list[pd.DataFrame]) -> pd.DataFrame:
    """The blocks' rows of each case as one row: ``rounds`` their sum, ``times_s`` round after round (what ``run
    --rounds`` writes), the worst status, every trust flag any block had, the worst block's readings."""
    first = blocks[0].set_index(col.CASE_ID, drop=False)
    frames = [r.set_index(col.CASE_ID, drop=False).reindex(first.index) for r in blocks]
    out = first.copy()
    for case_id in out.index:
        cells = [f.loc[case_id] for f in frames]
        statuses = [str(c[col.STATUS]) if isinstance(c[col.STATUS], str) else "missing" for c in cells]
        failed = next((s for s in statuses if s != Status.OK), None)
        if failed:
            out.loc[case_id, col.STATUS] = failed
            out.loc[case_id, col.ERROR] = next(
                (str(c[col.ERROR]) for c in cells if isinstance(c[col.ERROR], str) and c[col.ERROR]),
                f"{statuses.count(failed)} of {len(cells)} rounds {failed}",
            )
        for column in POOLED:
            if column in out.columns:
                out.loc[case_id, column] = ";".join(str(c[column]) for c in cells if isinstance(c[column], str))
        flags = {flag for c in cells for flag in trust.named(c[col.TRUST])}
        out.loc[case_id, col.TRUST] = ";".join(f for f in trust.FLAGS if f in flags)
        for column, worst in trust.WORST_OF_ROUNDS.items():  # the machine as the worst round saw it (run --rounds)
            values = [float(c[column]) for c in cells if column in c.index and _number(c[column])]
            if column in out.columns:
                out.loc[case_id, column] = repr(worst(values)) if values else ""
        times = [float(t) for t in str(out.loc[case_id, "times_s"]).split(";") if t]
        if times and col.TIME_MEDIAN_S in out.columns:
            out.loc[case_id, col.TIME_MEDIAN_S] = repr(statistics.median(times))
        out.loc[case_id, col.ROUNDS] = str(sum(int(c[col.ROUNDS]) for c in cells if _number(c[col.ROUNDS])))
    return out.reset_index(drop=True)


def _number(value: object) -> bool:
    try:
        return math.isfinite(float(str(value)))
    except ValueError:
        return False


def blocks(rounds: int) -> list[tuple[str, int]]:
    """The runs of the suite, in order: BASE, NEW, NEW, BASE (ABBA: a drift of the machine that is linear over the
    gate falls on both sides equally), each of half a side's rounds, interleaved among the cases. Two blocks a
    side, not one round each: every run of ``topk-bench run`` costs its start (Python, torch, the child
    template), as much as a round of the suite's cases on a busy two-core runner."""
    first, second = (rounds + 1) // 2, rounds // 2
    return [("BASE", first), ("NEW", first), ("NEW", second), ("BASE", second)]


def measure(base_tree: Path, suite: Path, rounds: int, out: Path) -> tuple[Path, Path]:
    """BASE's and NEW's CSVs (``out/BASE.csv``, ``out/NEW.csv``), ``rounds`` rounds a side in :func:`blocks`,
    each side's blocks pooled into one row per case."""
    trees = {"BASE": base_tree, "NEW": ROOT}
    measured: dict[str, list[pd.DataFrame]] = {"BASE": [], "NEW": []}
    for number, (side, count) in enumerate(blocks(rounds), start=1):
        measured[side].append(measure_block(side, trees[side], suite, count, out / f"{number}-{side}"))
    for side, frames in measured.items():
        pooled(frames).to_csv(out / f"{side}.csv", index=False)
    return out / "BASE.csv", out / "NEW.csv"


def incomplete(base: pd.DataFrame, new: pd.DataFrame, base_sha: str | None) -> list[str]:
    """Why the two sides cannot be judged in full: a case not ``ok`` or untimed on a side, a case one side lacks,
    BASE's rows not measured on BASE's code."""
    problems = []
    for side, frame in (("BASE", base), ("NEW", new)):
        for _, row in frame.iterrows():
            if str(row[col.STATUS]) != Status.OK or not text(row.get(col.TIMES_S)).strip():
                problems.append(f"{side} {_name(row)} is {row[col.STATUS]}: {text(row.get(col.ERROR))[:200]}")
    lacking = set(new[col.CASE_ID]) ^ set(base[col.CASE_ID])
    if lacking:
        problems.append(f"{len(lacking)} case(s) on one side only: {', '.join(sorted(lacking))}")
    if base_sha is not None:
        shas = {text(s).removesuffix("-dirty") for s in base[col.GIT_SHA]}
        if shas != {base_sha}:
            problems.append(f"BASE's rows name commit(s) {', '.join(sorted(shas))}, not the base {base_sha[:12]}")
    return problems


def _name(row: pd.Series) -> str:
    return f"{row[col.WORKLOAD]}/{text(row.get(col.LABEL)) or row[col.IMPL]}"


def text(value: object) -> str:
    """A cell as text ("" for an empty one, which a typed frame reads as NaN)."""
    return value if isinstance(value, str) else ""


def judge(base: pd.DataFrame, new: pd.DataFrame, thresholds: Thresholds, labels: tuple[str, str]) -> compare.Comparison:
    """``compare --relative-to sdpa`` of NEW against BASE, time and status only."""
    frames = []
    for frame in (base, new):
        frame = frame.copy()
        frame.attrs = base.attrs if frame is base else new.attrs
        for column in (col.PEAK_BYTES, col.RESERVED_BYTES):  # the memory gate's business, not this one's
            if column in frame.columns:
                frame[column] = math.nan
        frames.append(frame)
    return compare.compare_frames(*frames, thresholds, *labels, relative_to=REFERENCE)


def failing(result: compare.Comparison, factor: float) -> list[compare.CaseComparison]:
    """The cases that fail the gate: a regression, an invalid number, or a median ratio beyond the factor whatever
    the test says. On a busy runner the per-round ratios spread, and the test then cannot tell a real 1.3x from
    noise (p = 0.11 for topk_fast slowed 1.3x beside two busy loops): the factor is what judges, and contention
    earns a re-measure, never a pass."""
    return [
        case
        for case in result.cases
        if case.verdict in compare.FAILING or any(m.ratio is not None and m.ratio > factor for m in case.metrics)
    ]


def trust_of(frames: dict[str, pd.DataFrame], case: compare.CaseComparison) -> str:
    """The trust columns of a case's rows and its references' (the SDPA rows at its parameters), both sides."""
    parts = []
    for side, frame in frames.items():
        rows = frame[frame[col.CASE_ID] == case.case_id]
        if not len(rows):
            continue
        row = rows.iloc[0]
        refs = frame[(frame[col.IMPL] == REFERENCE) & (frame[col.WORKLOAD] == row[col.WORKLOAD])]
        for what, r in [("", row), *((f" {REFERENCE}", ref) for _, ref in refs.iterrows())]:
            cells = [f"{c}={_cell(r[c])}" for c in TRUST_COLUMNS if c in r.index]
            parts.append(f"{side}{what}: {' '.join(cells)}")
    return "; ".join(parts)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.2f}"
    return str(value) or "-"


def contended(frames: dict[str, pd.DataFrame], cases: list[compare.CaseComparison]) -> bool:
    """Whether a row of these cases, or an SDPA row of their workloads, was measured busy or contended."""
    for frame in frames.values():
        workloads = set(frame[frame[col.CASE_ID].isin([c.case_id for c in cases])][col.WORKLOAD])
        rows = frame[frame[col.CASE_ID].isin([c.case_id for c in cases]) | (frame[col.IMPL] == REFERENCE)]
        rows = rows[rows[col.WORKLOAD].isin(workloads)]
        if any(set(trust.named(cell)) & {trust.BUSY, trust.CONTENDED} for cell in rows[col.TRUST]):
            return True
    return False


def parser() -> argparse.ArgumentParser:
    class OneLine(argparse.ArgumentParser):
        def error(self, message: str) -> None:  # type: ignore[override]
            one_line_error(message)
            raise SystemExit(2)

    parsed = OneLine(description=__doc__.splitlines()[0])
    parsed.add_argument("--base", help="the base revision (default: the commit in baselines/time-gate-base)")
    parsed.add_argument("--judge", nargs=2, type=Path, metavar=("BASE", "NEW"), help="judge two runs' CSVs only")
    parsed.add_argument("--out", type=Path, help="keep the measurements in this new directory (default: temporary)")
    parsed.add_argument("--rounds", type=int, default=ROUNDS, help=f"interleaved rounds a side (default {ROUNDS})")
    parsed.add_argument("--suite", type=Path, default=SUITE, help="the suite measured (default: suites/ci_time.toml)")
    parsed.add_argument("--time-factor", type=float, default=TIME_FACTOR)
    parsed.add_argument("--alpha", type=float, default=ALPHA)
    return parsed


def verdict(base_csv: Path, new_csv: Path, thresholds: Thresholds, base_sha: str | None) -> Judged:
    """The two runs judged, or why they cannot be (:func:`incomplete`)."""
    base, new = compare.load(base_csv), compare.load(new_csv)
    frames = {"BASE": base, "NEW": new}
    problems = incomplete(base, new, base_sha)
    if problems:
        return Judged(frames, None, problems)
    return Judged(frames, judge(base, new, thresholds, (str(base_csv), str(new_csv))), [])


@dataclasses.dataclass
class Judged:
    frames: dict[str, pd.DataFrame]
    result: compare.Comparison | None
    problems: list[str]


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    started = time.monotonic()
    thresholds = Thresholds(time_factor=args.time_factor, alpha=args.alpha)
    try:
        thresholds.validate()
        if args.rounds < 2:
            raise BadInput(f"expected at least 2, got {args.rounds} (one ratio per round is judged)", key="--rounds")
        if args.judge:
            if args.base:
                raise BadInput("judges two runs already made: it takes no --base", key="--judge")
            base_sha, (base_csv, new_csv) = None, [csv_of(path) for path in args.judge]
            judged = verdict(base_csv, new_csv, thresholds, None)
        else:
            if not args.suite.is_file():
                raise BadInput("no such suite file", file=str(args.suite))
            args.suite = args.suite.resolve()  # BASE's run starts in its worktree
            base_sha = base_revision(args.base)
            if args.out and args.out.exists() and any(args.out.iterdir()):
                raise BadInput("is not empty: the gate measures into a new directory", file=str(args.out))
            out = args.out or Path(tempfile.mkdtemp(prefix="topk-bench-time-gate-"))
    except BadInput as error:
        one_line_error(str(error))
        return 2
    kind = metadata.cpu_kind(metadata.cpu_capability(), metadata.cpu_flags())
    if base_sha is not None:
        print(f"time gate: {args.suite.name}, BASE {base_sha[:12]} and NEW (this checkout), {args.rounds} "
              f"interleaved rounds each, CPU kind {kind}, into {out}", flush=True)  # fmt: skip
        try:
            with checkout(base_sha) as tree:
                judged = verdict(*measure(tree, args.suite, args.rounds, out), thresholds, base_sha)
                bad = failing(judged.result, args.time_factor) if judged.result else []
                if bad and contended(judged.frames, bad):
                    print(f"time gate: failing case(s) measured under contention ({', '.join(c.name for c in bad)}): "
                          "measuring both again, once", flush=True)  # fmt: skip
                    judged = verdict(*measure(tree, args.suite, args.rounds, out / "again"), thresholds, base_sha)
        except Failed as error:
            judged = Judged({}, None, [str(error)])
    where = f"CPU kind {kind}, " if base_sha is not None else ""  # --judge: the files' machine, not this one
    head = f"time gate ({where}{time.monotonic() - started:.0f} s)"
    if judged.result is None:
        print(f"{head}: FAILED: cannot judge every case: " + "; ".join(judged.problems))
        return 1
    bad = failing(judged.result, args.time_factor)
    judged.result.failures += [
        f"{case.name}: a median ratio beyond x{args.time_factor} ({case.verdict.value} to the test) fails this gate"
        for case in bad
        if case.verdict not in compare.FAILING
    ]
    compare_render.print_rich(judged.result)
    if not bad and judged.result.passed:
        print(f"{head}: passed: {compare_render.summary(judged.result)}")
        return 0
    lines = [f"{case.name}: {case.verdict.value}; {trust_of(judged.frames, case)}" for case in bad]
    beyond = f"{len(bad)} of {len(judged.result.cases)} case(s) regressed or beyond x{args.time_factor}"
    print(f"{head}: FAILED: {beyond}" + "".join(f"\n  {line}" for line in lines))
    if not bad:  # failing for another reason (a case lost, nothing compared): compare's words
        print(f"  {compare_render.summary(judged.result)}")
    return 1


def csv_of(path: Path) -> Path:
    """A run's CSV (or the suite's CSV in a run's directory); BadInput naming it when there is none."""
    csv = path / f"{SUITE.stem}.csv" if path.is_dir() else path  # a directory of the gate's own suite
    if not csv.is_file():
        raise BadInput("no such CSV", file=str(path))
    return csv


if __name__ == "__main__":
    raise SystemExit(main())
