"""Query chunking / top-k at the paper's largest size, predicted: the paper's 3x (claims 3 and 5b).

    python scripts/paper_ratios.py            # 19 s of CPU time (2 min 19 s wall at load 12 to 15)

For the MHA layer at 65K tokens (suites/mha.toml, suites/paper/mha.toml) and the feed-forward
layer at d_ff = 65K (suites/ff.toml, suites/paper/ff.toml): the peak of query chunking and of
top-k, and their ratio, under the paper protocol (the authors' code, dropout 0.1 as they ran it,
and again with dropout 0) and ours. The cases are the suites' own, planned as ``topk-bench run
--predict`` plans them, so a number here is the one the suite's prediction gives; only the
``dropout = 0`` row changes an option. Peaks are allocated bytes, inputs and parameters included.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from topk_bench.case import Budget, Case
from topk_bench.predict.backends import predict
from topk_bench.run.plan import plan
from topk_bench.run.resolve import Flags

GIB = 1 << 30
SUITES = Path(__file__).resolve().parent.parent / "suites"
# (figure, x parameter, its value, suite of ours, suite under the paper protocol)
FIGURES = [("MHA", "seq_len", 65536, "mha.toml", "paper/mha.toml"), ("FF", "d_ff", 65536, "ff.toml", "paper/ff.toml")]


def cases_at(suite: Path, x: str, value: int, impls: tuple[str, str]) -> list[Case]:
    cases = {c.impl: c for c in plan(suite, Flags(predict=True)).cases if c.param_dict[x] == value}
    return [cases[name] for name in impls]


def without_dropout(case: Case) -> Case:
    return dataclasses.replace(case, options=tuple((k, 0.0 if k == "dropout" else v) for k, v in case.options))


def main() -> None:
    print(f"{'figure':6} {'column':26} {'query chunking':>15} {'top-k':>10} {'ratio':>7}")
    for figure, x, value, ours, paper in FIGURES:
        paper_cases = cases_at(SUITES / paper, x, value, ("qchunk_paper", "topk_paper"))
        rows = [
            ("paper protocol, dropout 0.1", paper_cases),
            ("paper protocol, dropout 0", [without_dropout(c) for c in paper_cases]),
            ("ours", cases_at(SUITES / ours, x, value, ("qchunk", "topk"))),
        ]
        for column, (chunked, topk) in rows:
            q, t = (predict(c, Budget()).peak_bytes for c in (chunked, topk))
            print(f"{figure:6} {column:26} {q / GIB:11.2f} GiB {t / GIB:6.2f} GiB {q / t:6.2f}x", flush=True)


if __name__ == "__main__":
    main()
