"""``compare --pair-by``: a case's key is the tuple of its values, so that no value with a comma in it pairs with
another case (impl ``Y`` with impl ``sdpa, impl=Y``); a column one side lacks is bad input naming the side, even
where a side repeats a key (it was a KeyError traceback)."""

from __future__ import annotations

import pandas as pd
import pytest

from topk_bench.errors import BadInput
from topk_bench.report.compare import compare_frames
from topk_bench.results.columns import REQUIRED_COLUMNS


def row(case_id: str, impl: str, label: str | None = None, **values) -> dict:
    out = dict.fromkeys(REQUIRED_COLUMNS, "")
    out.update(
        suite="t", case_id=case_id, workload="mha", impl=impl, label=label or impl, mode="fwd_bwd", device="cpu",
        method="measured", status="ok", peak_bytes=1000, time_median_s=0.1, times_s="0.1;0.1;0.1", seq_len=16,
    )  # fmt: skip
    out.update(values)
    return out


def frame(*rows: dict) -> pd.DataFrame:
    return pd.DataFrame(rows).set_index("case_id", drop=False)


def test_a_value_holding_the_separator_pairs_with_nothing_else():
    base = frame(row("b1", "Z", label="sdpa, impl=Y"), row("b2", "Z", label="z"))
    new = frame(row("n1", "Y, impl=Z", label="sdpa"), row("n2", "Z", label="z"))
    # Joined as text, both first rows read "label=sdpa, impl=Y, impl=Z, cpu, measured": one case, paired.
    result = compare_frames(base, new, pair_by=["label", "impl"], allow_missing=True)
    assert [c.case_id for c in result.cases] == ["n2"]
    assert sorted(cid for cid, _ in result.only_new) == ["n1"] and [cid for cid, _ in result.only_base] == ["b1"]


def test_a_column_only_one_side_has_is_one_line_naming_the_side():
    base = frame(row("b1", "Z", seq_len=16), row("b2", "Z", seq_len=32))  # two rows of impl Z: a repeated key
    new = frame(row("n1", "Z", chunk_size=256), row("n2", "Y", chunk_size=512))
    with pytest.raises(BadInput) as raised:
        compare_frames(base, new, pair_by=["chunk_size"])
    assert (
        str(raised.value)
        == "--pair-by: column 'chunk_size' is not in BASE (only NEW has it): pair by columns both sides have"
    )
    with pytest.raises(BadInput) as repeated:  # BASE repeats impl Z; the column only NEW has is no KeyError
        compare_frames(base, new, pair_by=["impl"])
    assert (
        str(repeated.value)
        == "--pair-by: 2 cases of BASE have impl=Z, cpu, measured (they differ in seq_len: name it too)"
    )
