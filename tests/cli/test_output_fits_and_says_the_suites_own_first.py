"""What the commands print fits the width it has: `doctor`'s table within 100 columns off a terminal, a run's lines
never split between a number and its unit; `list SUITE` shows the suite's own implementations and workload first."""

from __future__ import annotations

import io
import re

from rich.console import Console

from runner_fakes import write_suite
from topk_bench.units import wrapped

LONG = (
    "relative error 3.2e-11 in float64 and 4.1e-06 in float32 against the float64 reference of a tiny mha layer, "
    "every op on the device, output, input gradient and parameter gradients; selection budgets cover every key"
)


def test_doctor_fits_100_columns_off_a_terminal(cli, monkeypatch):
    from topk_bench.doctor import diagnose
    from topk_bench.doctor.check import Check, Result

    checks = [Check(f"agreement: my_attention_{i}", Result.PASS, LONG) for i in range(3)]
    monkeypatch.setattr(diagnose, "diagnose", lambda *a, progress=None, **k: checks)
    monkeypatch.delenv("COLUMNS", raising=False)
    result = cli("doctor")
    assert result.code == 0 and "all 3 checks passed" in result.out
    lines = result.out.splitlines()
    assert max(map(len, lines)) <= 100, max(lines, key=len)
    assert "every op on the device" in " ".join(line.strip("│ ") for line in lines)  # folded, not cut


def test_a_line_wraps_between_words_never_between_a_number_and_its_unit():
    text = "24 cases to run, estimate about 40 s, at most 1.02 h (2 at a time, each within its 300 s time budget)"
    for width in range(20, 60):
        lines = wrapped(text, width).splitlines()
        assert not any(
            re.search(r"\d$", line) and re.match(r"(s|h|min|GiB|cases)\b", nxt) for line, nxt in zip(lines, lines[1:])
        )
        assert " ".join(lines) == text


def test_the_run_summary_on_a_narrow_terminal_keeps_numbers_with_their_units(tmp_path):
    import collections

    from topk_bench.run.progress import summary

    buffer = io.StringIO()
    summary(
        "a_suite_with_a_rather_long_name",
        tmp_path / "a.csv",
        collections.Counter(ok=40),
        collections.Counter(ok=40),
        381.2,
        console=Console(file=buffer, force_terminal=True, width=30),
        notes=["estimate was about 6.4 min, at most 5 h for 40 cases"],
    )
    lines = buffer.getvalue().splitlines()
    assert not any(re.search(r"\d$", a) and re.match(r"(s|h|min|cases)\b", b.strip()) for a, b in zip(lines, lines[1:]))
    assert any("6.35 min" in line for line in lines)  # the title: the elapsed time, its unit beside it


def test_list_of_a_suite_shows_its_own_implementations_and_workload_first(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    suite = write_suite(tmp_path)  # vanilla, qchunk (chunk_size 8) on mha
    result = cli("list", suite)
    assert result.code == 0
    text = result.out
    own = text.index("fake: its implementations")
    assert own < text.index("fake: its workload") < text.index("every registered implementation and workload")
    mine = text[own : text.index("fake: its workload")]
    assert re.findall(r"impl\[\d\]\s+(\w+)", mine) == ["vanilla", "qchunk"]
    assert "chunk_size=8*" in mine and "performer" not in mine
    assert "seq_len=16, 32, 64, 128 (swept)*" in " ".join(text.split()) or "seq_len=16, 32, 64, 128" in text
