"""The CPU time gate of ``.ci/run``: the project's own time regressions, caught on the CPU kind it runs on.

``suites/ci_time.toml`` (the selection methods' decode step and topk_fast's training step, SDPA beside each, in
interleaved rounds) is measured and compared with the committed baseline of this machine's CPU kind,
``baselines/ci-time-<kind>.csv``, by ``compare --relative-to sdpa``: each method's time over SDPA's in
the same round, so that what a shared machine does to both divides out. Only time and status are judged here
(a measured peak is the memory gate's: the predicted peaks of ``suites/ci.toml``).

- A kind without a baseline: one line saying so and the command that adds it; the gate passes.
- Rows measured under contention (``trust`` has ``contended``: a thread of the case waited for a CPU) are
  measured again once, with their references (the whole suite, interleaved again); if the gate still fails
  where rows are contended, it says inconclusive and passes with that warning: noise on a shared machine must
  not block a landing.

Exit 0: passed, inconclusive, or no baseline for this kind; 1: a regression; 2: bad input.

    python scripts/time_gate.py                         # what .ci/run does
    python scripts/time_gate.py --write-baseline        # measure, and make it this kind's baseline
    python scripts/time_gate.py --results DIR           # judge a run already made (no measuring)
"""

from __future__ import annotations

import argparse
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from topk_bench.errors import BadInput  # noqa: E402 -- after the checkout is on the path
from topk_bench.measure import metadata  # noqa: E402
from topk_bench.report import compare, compare_render, relative  # noqa: E402
from topk_bench.report.stats import Verdict  # noqa: E402
from topk_bench.report.thresholds import Thresholds  # noqa: E402
from topk_bench.results import columns as col  # noqa: E402
from topk_bench.results import trust  # noqa: E402

SUITE = ROOT / "suites" / "ci_time.toml"
BASELINES = ROOT / "baselines"
REFERENCE = "sdpa"
# The tolerance, from the run-to-run spread of this suite's per-case median ratio on the project's machines
# (docs/regression.md, "The CPU time gate"): three runs of unchanged code, AVX-512-BF16, load ~2, no row
# contended, changed by at most x1.13 (sink_window, the shortest step), x1.04 for the others; runs whose rows
# were all contended (load 3-4) changed by up to x3.3, which is what the re-measure and "inconclusive" are for.
TIME_FACTOR = 1.2
# 7 rounds a side: one outlier round in either run raises the Mann-Whitney p of a clear 1.3x change to 0.011
# (seen: a 0.93 round among 0.69-0.73 in a baseline's topk_fast decode), so 0.01 would hide it; the factor
# above, not alpha, is what keeps the noise out.
ALPHA = 0.05


def kind() -> str:
    """This machine's CPU kind, as the baselines are named: the instruction set ATen uses and the bf16/AMX
    flags (``avx512-avx512_bf16``, ``avx2``)."""
    return metadata.cpu_kind(metadata.cpu_capability(), metadata.cpu_flags())


def baseline_of(cpu_kind: str) -> Path:
    return BASELINES / f"ci-time-{cpu_kind}.csv"


def measure(out: Path) -> Path:
    """The suite measured afresh into ``out``: its CSV."""
    command = [sys.executable, "-m", "topk_bench", "run", str(SUITE), "--out", str(out), "--no-resume", "--quiet"]
    done = subprocess.run(command, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(done.returncode)
    return out / f"{SUITE.stem}.csv"


def contended(frame) -> list:
    """The case_ids of the rows measured under contention (``trust`` names ``contended``)."""
    return [cid for cid, cell in frame[col.TRUST].items() if trust.CONTENDED in trust.named(cell)]


def named(frame, case_ids: list) -> list[str]:
    return [f"{frame.at[cid, col.WORKLOAD]}/{frame.at[cid, col.LABEL] or frame.at[cid, col.IMPL]}" for cid in case_ids]


def judge(baseline: Path, csv: Path, thresholds: Thresholds) -> compare.Comparison:
    """``compare --relative-to sdpa`` of the run against the baseline, time and status only."""
    base, new = compare.load(baseline), compare.load(csv)
    for frame in (base, new):  # memory is the memory gate's; a measured peak is not this gate's business
        for column in (col.PEAK_BYTES, col.RESERVED_BYTES):
            if column in frame.columns:
                frame[column] = math.nan
    return compare.compare_frames(base, new, thresholds, str(baseline), str(csv), relative_to=REFERENCE)


def failing_contended(result: compare.Comparison, csv: Path) -> tuple[list[str], list[str]]:
    """The failing cases whose time was measured under contention (their own row's or their reference's), and
    the others, by name."""
    frame = compare.load(csv)
    flagged = set(contended(frame))
    divided = relative.relative_times(frame, REFERENCE, str(csv))
    noisy, real = [], []
    for case in result.cases:
        if case.verdict not in (Verdict.REGRESSION, Verdict.INVALID):
            continue
        reference = divided.get(case.case_id)
        rows = {case.case_id, reference.reference if isinstance(reference, relative.Relative) else ""}
        (noisy if rows & flagged else real).append(case.name)
    return noisy, real


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", help="the CPU kind whose baseline to use (default: this machine's)")
    parser.add_argument("--baseline", type=Path, help="the baseline CSV (default: baselines/ci-time-KIND.csv)")
    parser.add_argument("--results", type=Path, help="judge this run (a CSV or directory) instead of measuring")
    parser.add_argument("--out", type=Path, help="where to measure (default: a new temporary directory)")
    parser.add_argument("--write-baseline", action="store_true", help="measure, and make the run this kind's baseline")
    parser.add_argument("--time-factor", type=float, default=TIME_FACTOR)
    parser.add_argument("--alpha", type=float, default=ALPHA)
    args = parser.parse_args(argv)
    started = time.monotonic()
    cpu_kind = args.kind or kind()
    baseline = args.baseline or baseline_of(cpu_kind)
    out = args.out or Path(tempfile.mkdtemp(prefix="topk-bench-time-gate-"))
    if args.write_baseline:
        csv = measure(out)
        frame = compare.load(csv)
        if flagged := contended(frame):
            print(f"time gate: warning: rows measured under contention ({', '.join(named(frame, flagged))}): a "
                  "quieter moment makes a better baseline")  # fmt: skip
        baseline.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(csv, baseline)
        print(f"time gate: {baseline} written for CPU kind {cpu_kind}: commit it")
        return 0
    if not baseline.exists():
        print(f"time gate: no baseline for CPU kind {cpu_kind} ({baseline.relative_to(ROOT)}): passed without "
              f"judging; add one on a machine of this kind: python scripts/time_gate.py --write-baseline")  # fmt: skip
        return 0
    thresholds = Thresholds(time_factor=args.time_factor, alpha=args.alpha)
    try:
        thresholds.validate()
        csv = args.results or measure(out)
        frame = compare.load(csv)
        if args.results is None and (flagged := contended(frame)):
            print(f"time gate: measured under contention ({', '.join(named(frame, flagged))}): measuring again once")
            csv = measure(out / "again")
        result = judge(baseline, csv, thresholds)
    except BadInput as error:
        print(f"time gate: error: {error}", file=sys.stderr)
        return 2
    compare_render.print_rich(result)
    seconds = time.monotonic() - started
    head = f"time gate (CPU kind {cpu_kind}, {len(result.cases)} cases, {seconds:.0f} s)"
    if result.passed:
        print(f"{head}: passed")
        return 0
    noisy, real = failing_contended(result, Path(csv))
    if noisy and not real and not result.failures:
        print(f"{head}: inconclusive: passed with a warning: the failing cases were measured under contention "
              f"({', '.join(noisy)}), twice: re-run on a quieter machine")  # fmt: skip
        return 0
    print(f"{head}: FAILED: {compare_render.summary(result)}")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
