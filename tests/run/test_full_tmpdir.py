"""A full TMPDIR stops the run with its reason, and a re-run completes."""

from __future__ import annotations

from faults import Cli, tiny_suite

# --- a full TMPDIR -------------------------------------------------------------------------------------


def test_a_full_tmpdir_stops_the_run_with_its_reason_and_a_rerun_completes(tmp_path, monkeypatch, capsys):
    """A real 64 KiB tmpfs as TMPDIR, with room for the case file and not the result: the children measure,
    then cannot write their results. No case is to blame: the run stops with one line naming TMPDIR (exit 2)
    and writes no row for it; once there is room again, running again measures them."""
    import tempfile

    from faults import fill, tmpfs
    from topk_bench.results import store
    from topk_bench.run.launcher import run_isolated

    suite = tiny_suite(tmp_path)
    out = tmp_path / "out"
    with tmpfs(tmp_path / "scratch") as scratch:
        filler = fill(scratch, leave_bytes=4096)
        monkeypatch.setattr(tempfile, "tempdir", str(scratch))
        real = Cli(monkeypatch, capsys, fake=run_isolated)  # the real launcher, children and all
        result = real("run", suite, "--out", out)
        line = result.err.strip().splitlines()[-1]  # after the run's first notes
        assert "Traceback" not in result.err and line.startswith("topk-bench: error: "), result.err
        assert result.code == 2 and str(scratch) in line and "No space left on device" in line, line
        assert "TMPDIR" in line and "run again" in line, line
        assert store.read(out / "tiny.csv").rows == []
        filler.unlink()
        again = real("run", suite, "--out", out, "-q")
        assert again.code == 0, again.err
        rows = store.read(out / "tiny.csv").rows
        assert [r["status"] for r in rows] == ["ok", "ok"], rows
