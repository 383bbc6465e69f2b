"""Fit the constants of topk_bench/run/estimate.py from runs that took place, and say how far the estimate is off.

    python scripts/calibrate_estimates.py RESULTS_DIR [RESULTS_DIR ...]

Each folder holds results CSVs with ``wall_s`` (what each case's child took) and their ``.meta.json`` (which names
the suite file and ``--set``'s values). Every row is matched to its case as ``run`` plans it today, its seconds
divided by the load it ran under (``load_start``, per core, at least 1), then, by non-negative least squares
(each suite and method weighing alike):

- a predicted case: ``wall_s = PREDICT_CASE_S + PREDICT_OP_S x ops_per_iter``;
- its ops: ``ops_per_iter = layers x (OPS_PER_CALL + OPS_PER_CHUNK x n)``, ``n`` the query chunks past the
  first, and each implementation's own ops per chunk (``OPS_PER_CHUNK_OF``: set by hand from what is printed);
- a measured iteration: ``time_median_s = flops / (CPU_FLOPS_PER_THREAD x threads) + bytes / CPU_BYTES_PER_S +
  ops x OP_S`` (FLOPs and bytes: the workload's cost model);
- a measured case: ``wall_s - iterations x time_median_s = MEASURED_CASE_S + PROFILE_OP_S x ops``.

Then, per suite and method, the sum of ``wall_s`` against the sum the estimate gives with the constants in use
(estimate.py) and with the fitted ones. Copy the fitted constants into estimate.py by hand, rounded.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IN_USE: dict[str, float] = {}  # estimate.py's constants as they are, before any fit changes them here


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    import numpy as np
    import pandas as pd
    from scipy.optimize import minimize, nnls

    from topk_bench import workloads
    from topk_bench.run import estimate
    from topk_bench.run.plan import plan
    from topk_bench.run.resolve import Flags

    IN_USE.update({name: getattr(estimate, name) for name in dir(estimate) if name.isupper()})
    pairs = []  # (suite, case, row)
    for folder in map(Path, argv):
        for meta_path in sorted(folder.glob("*.meta.json")):
            meta = json.loads(meta_path.read_text())
            csv = meta_path.with_name(meta_path.name.replace(".meta.json", ".csv"))
            # A run before meta.json named its suite file: the shipped suite of that name.
            suite_file = meta.get("suite_file") or ROOT / "suites" / f"{meta['suite']}.toml"
            if not Path(suite_file).exists() or not csv.exists():
                continue
            rows = pd.read_csv(csv)
            if "wall_s" not in rows:
                continue
            for (device, method), group in rows.groupby(["device", "method"]):
                # --set as the run had it (meta.json's overrides): the same cases.
                flags = Flags(device=device, predict=method == "predicted", sets=meta.get("overrides") or {})
                cases = {c.case_id: c for c in plan(suite_file, flags, yes=True).cases}
                for _, row in group.iterrows():
                    case = cases.get(row["case_id"])
                    if case is not None and row["status"] == "ok" and pd.notna(row["wall_s"]):
                        # As on a machine to itself: the row's seconds over the load it ran under (per core,
                        # its own threads included), as estimate.slowdown scales them back.
                        load = max(1.0, float(row["load_start"])) if pd.notna(row.get("load_start")) else 1.0
                        row = row.copy()
                        row["wall_s"] /= load
                        if pd.notna(row.get("time_median_s")):
                            row["time_median_s"] /= load
                        if pd.notna(row.get("threads")):  # what it ran with (threads = auto: the machine's load)
                            case = dataclasses.replace(case, threads=int(row["threads"]))
                        pairs.append((meta["suite"], case, row))
    if not pairs:
        print("no row with wall_s whose meta.json names its suite file")
        return 1

    # Each suite and method weighs alike, however many rows it has (decode's 462 predictions would drown the rest).
    def weights(chosen):
        keys = [(suite, str(c.method)) for suite, c, _ in pairs if any(c is d for d, _ in chosen)]
        counts = {k: keys.count(k) for k in keys}
        return np.sqrt([1.0 / counts[k] for k in keys])

    def fit(columns, target, names, chosen):
        w = weights(chosen)
        solution, _ = nnls(np.array(columns, float).T * w[:, None], np.array(target, float) * w)
        for name, value in zip(names, solution):
            print(f"  {name} = {value:.3g}")
        return dict(zip(names, solution))

    predicted = [(c, r) for _, c, r in pairs if c.predicted]
    measured = [(c, r) for _, c, r in pairs if not c.predicted]
    fitted = {}
    if predicted:
        print(f"predicted cases ({len(predicted)} rows):")
        fitted |= fit(
            [[1.0] * len(predicted), [r["ops_per_iter"] for _, r in predicted]],
            [r["wall_s"] for _, r in predicted],
            ["PREDICT_CASE_S", "PREDICT_OP_S"],
            predicted,
        )
    every = predicted + measured
    calls, chunked = [], []
    slopes: dict[str, list[float]] = {}
    for case, row in every:
        traffic = workloads.traffic(case)
        layers = case.param_dict.get("layers", 1)
        n = estimate.chunks(case, traffic.tokens_per_sequence if traffic else 1) - 1
        calls.append(layers)
        chunked.append(layers * n)
        if n >= 7:
            slopes.setdefault(case.impl, []).append((row["ops_per_iter"] / layers - estimate.OPS_PER_CALL) / n)
    print(f"ops per iteration ({len(every)} rows):")
    fitted |= fit([calls, chunked], [r["ops_per_iter"] for _, r in every], ["OPS_PER_CALL", "OPS_PER_CHUNK"], every)
    print("  ops per chunk past the first, by implementation (7 chunks or more; OPS_PER_CHUNK_OF):")
    for impl, values in sorted(slopes.items()):
        print(f"    {impl}: {np.median(values):.0f} ({len(values)} rows)")
    if measured:
        print(f"measured iterations ({len(measured)} rows):")
        traffics = [workloads.traffic(c) for c, _ in measured]
        inverse = fit(
            [
                [t.flops / c.threads for t, (c, _) in zip(traffics, measured)],
                [t.bytes for t in traffics],
                [r["ops_per_iter"] for _, r in measured],
            ],
            [r["time_median_s"] for _, r in measured],
            ["1 / CPU_FLOPS_PER_THREAD", "1 / CPU_BYTES_PER_S", "OP_S"],
            measured,
        )
        for name in ("CPU_FLOPS_PER_THREAD", "CPU_BYTES_PER_S"):
            value = inverse[f"1 / {name}"]
            fitted[name] = 1 / value if value > 0 else float("inf")
            print(f"  {name} = {fitted[name]:.3g}")
        fitted["OP_S"] = inverse["OP_S"]
        print("measured cases besides their iterations:")
        compiled = [r.get("compile_s") for _, r in measured if pd.notna(r.get("compile_s"))]
        if compiled:
            fitted["COMPILE_S"] = float(np.median(compiled))
            print(f"  COMPILE_S = {fitted['COMPILE_S']:.3g} (the median compile_s)")
        fitted |= fit(
            [
                [1.0] * len(measured),
                [r["ops_per_iter"] for _, r in measured],
                [len(c.quality) for c, _ in measured],
            ],
            [
                r["wall_s"]
                - estimate.iterations(c, r["time_median_s"]) * r["time_median_s"]
                - (r["compile_s"] if pd.notna(r.get("compile_s")) else 0.0)
                for c, r in measured
            ],
            ["MEASURED_CASE_S", "PROFILE_OP_S", "QUALITY_S"],
            measured,
        )

    if predicted:
        # The ops model leaves the suites' totals off where one implementation dispatches far more ops than it
        # says (topk_fast's key tiles): the predicted seconds again, to make each suite's total right (the squared
        # logarithms of its ratio, summed over the suites), from the row-by-row ones.
        # Only the two seconds: the ops model (OPS_*) is the one in use, set by hand from the rows' ops (its fit
        # above, printed for it, is pulled about by the decoder's twelve layers), and a measured case counts its
        # ops too.
        names = ["PREDICT_CASE_S", "PREDICT_OP_S"]
        suites = {}
        for suite, case, row in pairs:
            if case.predicted:
                suites.setdefault(suite, []).append((case, row["wall_s"]))

        def off(values):
            for name, value in zip(names, values):
                setattr(estimate, name, value)
            return sum(
                np.log(sum(estimate.case_seconds(c) for c, _ in chosen) / sum(w for _, w in chosen)) ** 2
                for chosen in suites.values()
            )

        for name in ("OPS_PER_CALL", "OPS_PER_CHUNK"):
            fitted[name] = IN_USE[name]
            setattr(estimate, name, IN_USE[name])
        start = [fitted.get(n, getattr(estimate, n)) for n in names]
        scale = np.array([max(abs(v), 1e-6) for v in start])
        best = minimize(lambda u: off(u * scale), np.ones(len(names)), bounds=[(0, None)] * len(names))
        print("predicted constants fitted to the suites' totals:")
        for name, value in zip(names, best.x * scale):
            fitted[name] = float(value)
            print(f"  {name} = {value:.3g}")

    in_use = {name: value for name, value in IN_USE.items() if name in fitted}
    print("\nsum of wall_s against the estimate's sum (constants in use | fitted):")
    for suite in dict.fromkeys(s for s, _, _ in pairs):
        for method in ("predicted", "measured"):
            chosen = [(c, r) for s, c, r in pairs if s == suite and str(c.method) == method]
            if not chosen:
                continue
            took = sum(r["wall_s"] for _, r in chosen)
            sums = []
            for constants in (in_use, fitted):
                for name, value in constants.items():
                    setattr(estimate, name, value)
                sums.append(sum(estimate.case_seconds(c) for c, _ in chosen))
            for name, value in in_use.items():
                setattr(estimate, name, value)
            print(
                f"  {suite} ({method}, {len(chosen)} cases): took {took:.1f} s; estimate {sums[0]:.1f} s "
                f"({sums[0] / took:.2f}x) | {sums[1]:.1f} s ({sums[1] / took:.2f}x)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
