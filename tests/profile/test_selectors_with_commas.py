"""``profile --case`` picks values that hold a comma (the built-in labels do: ``Top-k fast (size=1024,
topk=128)``): given whole, quoted, or in a ``--case`` of its own; a failed match says which characters to
quote."""

from __future__ import annotations

import pytest

from topk_bench.cli import main
from topk_bench.errors import BadInput
from topk_bench.profile import select
from topk_bench.run.plan import plan
from topk_bench.run.resolve import Flags

LABEL = "Top-k fast (size=1024, topk=128)"


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return plan("suites/topk_fast.toml", Flags(predict=True, out=tmp_path_factory.mktemp("o")), yes=True).cases


@pytest.mark.parametrize(
    "given",
    [
        [f"label={LABEL}"],  # whole: what follows label= is one of the labels
        [f'label="{LABEL}"'],
        [f"label='{LABEL}'"],
        [f'label="{LABEL}",seq_len=4096'],
        [f"label={LABEL}", "seq_len=4096"],  # a --case each
    ],
)
def test_a_label_holding_a_comma_is_selected(cases, given):
    chosen = select.select(cases, select.parse(given, select.known_values(cases)))
    assert chosen and {c.label for c in chosen} == {LABEL}, [c.label for c in chosen]
    if len(given) > 1 or "seq_len" in given[0]:
        assert [c.param_dict["seq_len"] for c in chosen] == [4096]


def test_a_quote_inside_a_quoted_value_is_doubled():
    assert select.parse('label="say ""hi"", then",impl=x') == {"label": 'say "hi", then', "impl": "x"}
    with pytest.raises(BadInput, match="not closed"):
        select.parse('label="open')


def test_a_failed_match_says_what_to_quote(cases, capsys, monkeypatch, tmp_path):
    with pytest.raises(BadInput, match=r"is quoted: --case 'label=\"Top-k") as raised:
        select.select(cases, select.parse("label=Top-k fast (size=1024,topk=128)", select.known_values(cases)))
    assert "','" in str(raised.value)
    with pytest.raises(SystemExit) as exited:
        main(
            [
                "profile",
                "suites/topk_fast.toml",
                "--case",
                "label=Top-k fast (size=9",
                "--predict",
                "--out",
                str(tmp_path),
            ]
        )
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1 and "is quoted" in err, err
