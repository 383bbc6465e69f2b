"""Benchmark (not a test): what the GPU time model adds to a CUDA prediction, in CPU time.

    .venv/bin/python benchmarks/harness/bench_time_model_cost.py [SUITE] [--max-size N] [--rounds R]

Every case of SUITE (default suites/mha.toml) up to ``--max-size`` tokens, predicted for CUDA in this one warm
process with the time model (``predict_cuda``'s default: the op counter that also records each kernel, then the
estimate) and without it (``make_costs=None``), alternating which goes first from round to round; CPU time
(``time.process_time``), as wall time on a loaded machine says little. Prints the totals side by side and their
ratio.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from topk_bench.predict import backends
from topk_bench.run.plan import plan
from topk_bench.run.resolve import Flags

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("suite", nargs="?", default=str(ROOT / "suites" / "mha.toml"))
    parser.add_argument("--max-size", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    cases = [
        c
        for c in plan(Path(args.suite), Flags(predict=True, device="cuda"), yes=True).cases
        if (dict(c.params).get("seq_len") or dict(c.params).get("kv_len") or 0) <= args.max_size
    ]
    backends.predict_cuda(cases[0])  # the imports and caches of a first case, outside the comparison
    spent = {"with": 0.0, "without": 0.0}
    for r in range(args.rounds):
        order = ("with", "without") if r % 2 == 0 else ("without", "with")
        for case in cases:
            for which in order:
                start = time.process_time()
                if which == "with":
                    backends.predict_cuda(case)
                else:
                    backends.predict_cuda(case, make_costs=None)
                spent[which] += time.process_time() - start
    load = os.getloadavg()
    print(
        f"{len(cases)} cases x {args.rounds} rounds, CPU time: with the time model {spent['with']:.2f} s, "
        f"without {spent['without']:.2f} s (x{spent['with'] / spent['without']:.2f}); "
        f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
    )


if __name__ == "__main__":
    main()
