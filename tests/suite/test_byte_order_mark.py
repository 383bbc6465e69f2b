"""A TOML file with a byte-order mark is read."""

from __future__ import annotations

import pytest

from faults import tiny_suite


@pytest.mark.parametrize("which", ["suite", "bench.toml"])
def test_a_toml_file_with_a_byte_order_mark_is_read(tmp_path, cli, which):
    """An editor's BOM gave "Invalid statement (at line 1, column 1)"."""
    suite = tiny_suite(tmp_path)
    config = tmp_path / "bench.toml"
    config.write_text("repeats = 1\n")
    target = suite if which == "suite" else config
    target.write_bytes(b"\xef\xbb\xbf" + target.read_bytes())
    result = cli("run", suite, "--out", tmp_path / "out", "--config", config, "-q")
    assert result.code == 0, result.err
