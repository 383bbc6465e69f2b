"""A plug-in that ends the process or hangs at import: one line for run and list, bad input after its time."""

from __future__ import annotations

import pytest

from faults import tiny_suite

# --- plug-ins that end the process, at import or when called -------------------------------------------


def _topk_bench(*args, timeout=600):
    import os
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "topk_bench", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "250"},
    )


def test_a_plugin_ending_the_process_at_import_is_one_line_for_run_list_and_doctor(tmp_path):
    """os._exit(0) at import made run, list and doctor exit 0 with no output and no files."""
    plugin = tmp_path / "quits.py"
    plugin.write_text("import os\nos._exit(0)\n")
    suite = tiny_suite(tmp_path, extra='plugins = ["quits.py"]')
    for args in (
        ("run", suite, "--out", tmp_path / "out"),
        ("list", "--plugins", plugin),
        ("list", suite),
        ("doctor", "--plugins", plugin),
    ):
        result = _topk_bench(*args)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and "Traceback" not in result.stderr, (args, result.stderr)
        assert lines[-1].startswith("topk-bench: error: ") and "quits.py" in lines[-1], (args, result.stderr)
        assert "ended the process (exit code 0" in lines[-1], (args, lines[-1])
    assert not (tmp_path / "out").exists()


def test_a_plugin_hanging_at_import_is_bad_input_after_its_time(tmp_path):
    from topk_bench import plugins
    from topk_bench.errors import BadInput

    plugin = tmp_path / "sleeps.py"
    plugin.write_text("import time\ntime.sleep(600)\n")
    with pytest.raises(BadInput, match="did not finish importing within 1 s"):
        plugins.IMPORT_LIMIT_S, saved = 1.0, plugins.IMPORT_LIMIT_S
        try:
            plugins.resolve([str(plugin)], key="--plugins")
        finally:
            plugins.IMPORT_LIMIT_S = saved
    assert "topk_bench_plugin_sleeps" not in " ".join(__import__("sys").modules)  # never imported here
