"""The fitted sizes of docs/REPRODUCTION.md (claims 2, 4 and 5), from the predicted results of the suites.

    for s in paper/mha mha paper/ff ff; do
      topk-bench run suites/$s.toml --predict --max-case-seconds 1500 --out results-pred
    done
    python scripts/paper_fits.py results-pred

A column (paper protocol: suites/paper/; ours: suites/) whose two suites are not in the folder is
said to be missing and left out.

- claim 2: vanilla's MHA peak as ``a L² + b L + c`` fitted to every predicted point (the
  over-budget ones too: a predicted row keeps its peak), solved for 30 GiB;
- claim 5: the FF peak of vanilla and of top-k as a line in d_ff fitted to the points within the
  budget (status ``ok``), solved for 30 GiB;
- claim 4: the d_ff at which vanilla's FF line reaches what top-k needs at d_ff = 65K.

Fitted sizes are printed whole: docs/REPRODUCTION.md rounds them to decimal thousands ("12.9K" for
12,861), while the sizes of the sweeps are powers of two ("65K" is 65,536, "1K of d_ff" is 1,024).
"""

from __future__ import annotations

import sys

import numpy as np

from topk_bench import load_results

GIB = 1 << 30
BUDGET = 30 * GIB
COLUMNS = {"paper protocol": ("paper_", "_paper"), "ours": ("", "")}


def points(frame, suite: str, impl: str, x: str, within_budget: bool) -> tuple[np.ndarray, np.ndarray]:
    rows = frame[(frame["suite"] == suite) & (frame["impl"] == impl)]
    rows = rows[rows["status"] == "ok"] if within_budget else rows[rows["peak_bytes"].notna()]
    rows = rows.sort_values(x)
    if rows.empty:
        raise SystemExit(f"no predicted rows of {impl} in suite {suite}: run the whole suite (see the docstring)")
    return rows[x].to_numpy(float), rows["peak_bytes"].to_numpy(float)


def solve(coefficients: np.ndarray, peak: float) -> float:
    """The largest real x > 0 at which the fitted polynomial reaches ``peak``."""
    roots = np.roots(np.concatenate([coefficients[:-1], [coefficients[-1] - peak]]))
    return max(r.real for r in roots if abs(r.imag) < 1e-9 and r.real > 0)


def main(results: str) -> None:
    frame = load_results(results)
    frame = frame[frame["method"] == "predicted"]
    for column, (suite_prefix, impl_suffix) in COLUMNS.items():
        mha, ff = f"{suite_prefix}mha", f"{suite_prefix}ff"
        missing = sorted({mha, ff} - set(frame["suite"]))
        if missing:
            print(f"{column}: not in {results} (no predicted rows of {', '.join(missing)})")
            continue
        vanilla, topk = f"vanilla{impl_suffix}", f"topk{impl_suffix}"
        L, peak = points(frame, mha, vanilla, "seq_len", within_budget=False)
        quadratic = np.polyfit(L, peak, 2)
        print(
            f"{column}: claim 2, vanilla MHA, quadratic fit over L = {L.min():.0f}..{L.max():.0f}: "
            f"30 GiB at L = {solve(quadratic, BUDGET):,.0f}"
        )
        fits = {}
        for impl in (vanilla, topk):
            d_ff, peak = points(frame, ff, impl, "d_ff", within_budget=True)
            fits[impl] = line = np.polyfit(d_ff, peak, 1)
            print(
                f"{column}: claim 5, {impl} FF, linear fit over d_ff = {d_ff.min():.0f}..{d_ff.max():.0f}: "
                f"{line[0] * 1024 / GIB:.3f} GiB per 1,024 of d_ff, 30 GiB at d_ff = {solve(line, BUDGET):,.0f}"
            )
        _, topk_peak = points(frame, ff, topk, "d_ff", within_budget=True)
        print(
            f"{column}: claim 4, {vanilla} FF reaches {topk}'s {topk_peak[-1] / GIB:.2f} GiB (at its largest "
            f"d_ff) at d_ff = {solve(fits[vanilla], topk_peak[-1]):,.0f}"
        )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python scripts/paper_fits.py RESULTS_DIR")
    main(sys.argv[1])
