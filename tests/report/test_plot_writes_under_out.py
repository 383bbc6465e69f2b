"""``plot`` of someone else's results writes under ``--out`` only: the suite name in ``meta.json`` becomes part
of a figure's file name, and an absolute path, ``../`` or a name longer than a file name may be cannot take the
figure anywhere else."""

from __future__ import annotations

import json

import pytest


def _files(root):
    return {p for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("named", ["absolute", "../../escaped", "a/../../b", "x" * 300, ".hidden"])
def test_plot_writes_under_out_whatever_meta_json_names(measured, cli, tmp_path, named):
    _, out, _ = measured
    elsewhere = tmp_path / "elsewhere"
    meta = out / "tiny.meta.json"
    data = json.loads(meta.read_text())
    data["suite"] = str(elsewhere) if named == "absolute" else named
    meta.write_text(json.dumps(data))
    plots = tmp_path / "a" / "b" / "plots"
    before = _files(tmp_path)
    result = cli("plot", out, "--out", plots)
    assert result.code == 0, result.err
    written = _files(tmp_path) - before
    assert written, "no figure drawn"
    assert all(plots in path.parents for path in written), sorted(written)
    assert not list(tmp_path.glob("elsewhere*")) and not list(tmp_path.glob("escaped*"))
    assert all(len(path.name) <= 255 for path in written)
    assert "is no suite name" in result.err  # the figure's name differs from meta.json's: said once


def test_a_file_name_keeps_a_name_and_makes_anything_else_safe():
    from topk_bench.untrusted import NAME_MAX, file_name

    assert file_name("mha", "cpu", "measured") == "mha-cpu-measured"
    assert file_name("/tmp/elsewhere", "cpu") == "tmp_elsewhere-cpu"
    assert file_name("../x", "cpu") == "x-cpu"
    long = file_name("y" * 500, "cpu")
    assert len(long) == NAME_MAX and long != file_name("y" * 499 + "z", "cpu")  # cut, still two names
