"""What a results file, a ``meta.json`` or a plug-in says is data: never rich markup, never mathtext, never a
terminal's command, never GitHub markup in a pull-request comment, never a spreadsheet formula.

- ``show`` and ``show --wide`` print a label holding ``[/]``, ``[link]``, ESC and U+202E as text, escapes shown;
- ``compare`` prints them so, and its ``--markdown`` escapes HTML, code spans and links as well;
- a label starting ``=`` is written into the CSV with a ``'`` before it, and read back as it was;
- ``plot`` draws mathtext in a label and a title as text; one figure that cannot be drawn is one line naming it,
  the others are drawn, exit 1;
- ``list --plugins`` and ``doctor --plugins`` show a plug-in's ``[/]`` as text.
"""

from __future__ import annotations

import csv
import json

from faults import tiny_suite
from locations import TESTS
from topk_bench.report.plots import figure
from topk_bench.results.frame import load_results

# TOML escapes: ESC (and an OSC 8 link), U+202E, a formula, rich markup, mathtext, HTML, a code span, a link.
LABEL = (
    r"=1+2 [/] closing tag [link]x[/link] \u001b]8;;http://e.x\u0007 \u202eevil $\\frac{1$ <b>`x`</b> [a](http://e.x)"
)
# What a terminal shows of it (a narrow column folds it at spaces).
SHOWN = ("=1+2 [/] closing tag", "[link]x[/link]", "\\x1b]8;;http://e.x\\x07", "\\u202eevil", "$\\frac{1$")


def _run(cli, tmp_path, out, name="tiny", title=""):
    extra = f'title = "{title}"' if title else ""
    suite = tiny_suite(tmp_path, name=name, sizes=(16, 32), impl_extra=f'label = "{LABEL}"', extra=extra)
    result = cli("run", suite, "--out", out, "-q")
    assert result.code == 0, result.err
    return out


def _raw_free(text: str) -> None:
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text


def test_show_and_wide_print_a_label_as_it_is(cli, tmp_path):
    out = _run(cli, tmp_path, tmp_path / "out")
    for wide in ((), ("--wide",)):
        shown = cli("show", out, *wide)
        assert shown.code == 0, shown.err
        assert all(part in shown.out for part in SHOWN), shown.out
        _raw_free(shown.out + shown.err)


def test_compare_prints_and_writes_markdown_that_shows_the_text(cli, tmp_path):
    base, new = _run(cli, tmp_path, tmp_path / "base"), _run(cli, tmp_path, tmp_path / "new")
    md = tmp_path / "c.md"
    result = cli("compare", base, new, "--markdown", md)
    assert result.code in (0, 1), result.err
    assert all(part in result.out for part in SHOWN), result.out
    _raw_free(result.out + result.err)
    text = md.read_text()
    _raw_free(text)
    assert "<b>" not in text and "\\<b\\>" in text and "\\`x\\`" in text and "\\[a\\](http\\://e.x)" in text


def test_a_formula_is_written_safely_and_read_back(cli, tmp_path):
    out = _run(cli, tmp_path, tmp_path / "out")
    cells = [row["label"] for row in csv.DictReader(open(out / "tiny.csv"))]
    assert cells and all(c.startswith("'=1+2 [/]") for c in cells)
    assert set(load_results(out)["label"]) == {cells[0][1:]}


def test_plot_draws_mathtext_as_text_and_one_failed_figure_stops_no_other(cli, tmp_path, monkeypatch):
    out = _run(cli, tmp_path, tmp_path / "out", name="a", title=r"$\\frac{ title")
    _run(cli, tmp_path, out, name="b")
    meta = out / "b.meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "title": r"$\unknowncommand{$"}))
    plots = tmp_path / "plots"
    drawn = cli("plot", out, "--out", plots)
    assert drawn.code == 0, drawn.err
    assert {p.name for p in plots.iterdir()} == {"a-cpu-measured.png", "b-cpu-measured.png"}

    def broken(*args, **kwargs):
        raise RuntimeError("cannot draw this one")

    monkeypatch.setitem(figure.RENDERERS, "a", broken)
    again = cli("plot", out, "--out", tmp_path / "again")
    assert again.code == 1
    errors = [line for line in again.err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "a-cpu-measured: not drawn: RuntimeError: cannot draw this one" in errors[0]
    assert "Traceback" not in again.err
    assert [p.name for p in (tmp_path / "again").iterdir()] == ["b-cpu-measured.png"]
    assert str(tmp_path / "again" / "b-cpu-measured.png") in again.out


def test_list_and_doctor_show_a_plug_ins_markup_as_text(cli, monkeypatch):
    plugin = TESTS / "plugins" / "markup_names.py"
    listed = cli("list", "--plugins", plugin)
    assert listed.code == 0, listed.err
    assert "test_markup[/]" in listed.out and "[link]here[/link]" in listed.out
    _raw_free(listed.out)

    from topk_bench.doctor import diagnose
    from topk_bench.doctor.check import Check, Result

    checks = [Check("agreement: test_markup[/]", Result.FAIL, "[/] wrong by [link]far[/link] \x1b[31m")]
    monkeypatch.setattr(diagnose, "diagnose", lambda *args, **kwargs: checks)
    doctor = cli("doctor", "--plugins", plugin)
    assert doctor.code == 1, doctor.err
    assert "agreement: test_markup[/]" in doctor.out and "[link]far[/link]" in doctor.out
    assert "1 of 1 checks failed: agreement: test_markup[/]" in doctor.out
    _raw_free(doctor.out)
