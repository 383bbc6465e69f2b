"""A plug-in that calls sys.exit or prints at import: bad input in the parent, an error row in a child,
and nothing on standard output."""

from __future__ import annotations

from faults import tiny_suite
from topk_bench.case import Case
from topk_bench.child import execute as child
from topk_bench.status import Status

# --- 7. a plug-in that exits at import ---------------------------------------------------------------


def test_a_plugin_calling_sys_exit_at_import_is_bad_input(tmp_path, cli):
    (tmp_path / "quits.py").write_text("import sys\nsys.exit(0)\n")
    suite = tiny_suite(tmp_path, extra='plugins = ["quits.py"]')
    result = cli("run", suite, "--out", tmp_path / "out")
    line = result.error_line
    assert result.code == 2 and "plugins" in line and "SystemExit" in line, line
    assert not (tmp_path / "out").exists()


def test_a_plugin_exiting_in_the_child_is_an_error_row(tmp_path):
    (tmp_path / "quits.py").write_text("import sys\nsys.exit(0)\n")
    case = Case.make(
        suite="t",
        workload="mha",
        impl="vanilla",
        params={"seq_len": 8, "d_model": 8, "heads": 2},
        plugins=(str(tmp_path / "quits.py"),),
    )
    result = child.execute(case)
    assert result.status == Status.ERROR and "SystemExit" in result.error


def test_prints_at_plugin_import_stay_off_stdout(tmp_path, cli):
    (tmp_path / "chatty.py").write_text("print('hello from a plug-in')\n")
    suite = tiny_suite(tmp_path, extra='plugins = ["chatty.py"]')
    result = cli("run", suite, "--out", tmp_path / "out")
    assert result.code == 0, result.err
    assert "hello from a plug-in" not in result.out and "hello from a plug-in" in result.err
