"""Files from anyone are read within bounds, and outputs replace only regular files: a FIFO, a device node or a
directory where a file is read or written is one line and exit 2, never a hang, a read until memory runs out, a
RecursionError, or a device node turned into a file (``--json /dev/null`` as root). Every FIFO and device node
here is made in a temporary folder (``os.mkfifo``, ``os.mknod``), never under /dev."""

from __future__ import annotations

import json
import os
import resource
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from locations import ROOT
from topk_bench import fileio
from topk_bench.errors import BadInput
from topk_bench.results import store

NULL = os.makedev(1, 3)  # the numbers of /dev/null and /dev/zero, given to nodes made in a temporary folder
ZERO = os.makedev(1, 5)


def device(path: Path, number: int = NULL) -> Path:
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, number)
    except PermissionError:
        pytest.skip("making a device node needs CAP_MKNOD (root)")
    return path


class _Expired(BaseException):  # not an Exception (nor an OSError): nothing on the way catches it
    pass


def within(seconds: int, fn):
    """``fn()``'s value, or None when it has not returned within ``seconds`` (a reader blocked on a FIFO): an alarm
    interrupts it, in this (the main) thread, where ``run`` sets its signal handlers."""

    def expire(signum, frame):
        raise _Expired

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        return fn()
    except _Expired:
        return None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def release(fifo: Path) -> None:
    """Unblock a reader still waiting on ``fifo`` (a writer opens it and closes it: end of file)."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


# --- writing: only a regular file or a new path is replaced -------------------------------------------------


@pytest.mark.parametrize("flag", ["--json", "--markdown"])
@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_compare_writes_its_report_only_to_a_regular_file(measured, cli, tmp_path, flag, kind):
    _, out, _ = measured
    target = tmp_path / "report.out"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "device":
        device(target)
    else:
        target.mkdir()
    result = cli("compare", out, out, flag, target)
    assert result.code == 2 and str(target) in result.error_line, result.err
    mode = target.lstat().st_mode
    assert {"fifo": stat.S_ISFIFO, "device": stat.S_ISCHR, "directory": stat.S_ISDIR}[kind](mode)
    if kind == "device":
        assert os.major(target.lstat().st_rdev) == 1 and os.minor(target.lstat().st_rdev) == 3
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".report.out")]  # no copy left beside it


def test_a_link_to_a_device_is_not_replaced_either(measured, cli, tmp_path):
    _, out, _ = measured
    node = device(tmp_path / "null")
    link = tmp_path / "report.json"
    link.symlink_to(node)
    result = cli("compare", out, out, "--json", link)
    assert result.code == 2 and "not a regular file" in result.error_line
    assert stat.S_ISCHR(node.lstat().st_mode) and link.is_symlink()


def test_compare_still_replaces_a_regular_file_and_writes_a_new_one(measured, cli, tmp_path):
    _, out, _ = measured
    old = tmp_path / "old.json"
    old.write_text("{}")
    assert cli("compare", out, out, "--json", old, "--markdown", tmp_path / "new.md").code == 0
    assert json.loads(old.read_text()) != {} and (tmp_path / "new.md").read_text()


def test_run_does_not_replace_a_fifo_where_its_meta_json_goes(cli, tmp_path):
    from faults import tiny_suite

    suite = tiny_suite(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    fifo = out / "tiny.meta.json"
    os.mkfifo(fifo)
    try:
        result = within(30, lambda: cli("run", suite, "--out", out, "-q"))
    finally:
        release(fifo)
    assert result is not None, "run blocked on the FIFO"
    assert result.code == 2 and str(fifo) in result.error_line and "not a regular file" in result.error_line
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert not (out / "tiny.csv").exists()


# --- reading: regular files only, within a size, JSON nested a bounded depth ------------------------------------


@pytest.fixture
def flagged(cli, tmp_path):
    """A results folder whose rows are flagged busy (so show reads its meta.json for the re-measure hint)."""
    from faults import tiny_suite
    from runner_fakes import FakeRun
    from topk_bench.results.columns import LOAD_END, LOAD_START

    class Busy(FakeRun):
        def __call__(self, case, budget):
            measurement = super().__call__(case, budget)
            measurement.metadata.update({LOAD_START: 1.8, LOAD_END: 1.8})
            return measurement

    cli.fake = Busy()
    out = tmp_path / "out"
    assert cli("run", tiny_suite(tmp_path), "--out", out, "-q").code == 0
    return out


@pytest.mark.parametrize("command", ["show", "plot", "compare"])
def test_a_fifo_as_meta_json_blocks_no_reader(flagged, cli, tmp_path, command):
    meta = flagged / "tiny.meta.json"
    meta.unlink()
    os.mkfifo(meta)
    argv = {"show": [flagged], "plot": [flagged, "--out", tmp_path / "plots"], "compare": [flagged, flagged]}[command]
    try:
        result = within(30, lambda: cli(command, *argv))
    finally:
        release(meta)
    assert result is not None, f"{command} blocked on the FIFO"
    if command == "plot":  # the plot's settings are in meta.json: it cannot be drawn as asked
        assert result.code == 2 and "not a regular file" in result.error_line, result.err
    else:  # only the re-measure hint reads it: SUITE stands for the suite file it would name
        assert result.code in (0, 1) and "topk-bench run SUITE --out" in result.out + result.err, result.err


def _limited(argv: list[str], memory: int = 3 << 30) -> subprocess.CompletedProcess:
    """``topk-bench ARGV`` in a child whose address space is ``memory`` bytes: a reader that reads without a bound
    fails there (MemoryError) instead of taking the machine's memory."""

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "topk_bench", *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=cap,
        cwd=ROOT,
        env=env,
    )


@pytest.mark.slow
def test_a_meta_json_linked_to_a_zero_device_is_refused_not_read(flagged, tmp_path):
    meta = flagged / "tiny.meta.json"
    meta.unlink()
    meta.symlink_to(device(tmp_path / "zero", ZERO))
    done = _limited(["plot", flagged, "--out", tmp_path / "plots"])
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"{meta}: cannot read: not a regular file" in done.stderr


@pytest.mark.slow
def test_a_sparse_4_gib_results_file_is_refused_in_one_line(measured, tmp_path):
    _, out, csv_path = measured
    with open(csv_path, "r+b") as f:
        f.truncate(4 << 30)  # sparse: no disk used, 4 GiB of zeros after the rows
    done = _limited(["show", csv_path])
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert (
        done.stderr.strip() == f"topk-bench: error: {csv_path}: cannot read: larger than 512 MiB (4294967296 "
        "bytes): not read"
    )


@pytest.mark.parametrize(
    "value, said",
    [
        ("NaN", "NaN is not a JSON number"),
        ("Infinity", "Infinity is not a JSON number"),
        ("-Infinity", "-Infinity is not a JSON number"),
        ("1e999", "1e999 is beyond a float"),
    ],
)
def test_a_log_x_that_is_no_number_is_one_line(flagged, cli, tmp_path, value, said):
    meta = flagged / "tiny.meta.json"
    data = json.loads(meta.read_text())
    data.setdefault("plot", {})
    text = json.dumps(data).replace('"plot": {', f'"plot": {{"log_x": {value}, ', 1)
    meta.write_text(text)
    result = cli("plot", flagged, "--out", tmp_path / "plots")
    assert result.code == 2 and f"{meta}: unreadable JSON ({said}" in result.error_line, result.err


def test_json_nested_100000_deep_is_one_line(flagged, cli, tmp_path):
    meta = flagged / "tiny.meta.json"
    meta.write_text("[" * 100_000 + "]" * 100_000)
    result = cli("plot", flagged, "--out", tmp_path / "plots")
    assert result.code == 2 and f"{meta}: unreadable JSON (nested deeper than" in result.error_line, result.err


def test_json_nested_within_the_bound_is_read(tmp_path):
    shallow = tmp_path / "shallow.json"
    shallow.write_text("[" * fileio.JSON_DEPTH + "]" * fileio.JSON_DEPTH)
    assert fileio.read_json(shallow) is not None
    deep = tmp_path / "deep.json"
    deep.write_text("[" * (fileio.JSON_DEPTH + 1) + "]" * (fileio.JSON_DEPTH + 1))
    with pytest.raises(BadInput, match="nested deeper than 32 levels"):
        fileio.read_json(deep)


def test_a_fifo_suite_file_is_one_line(cli, tmp_path):
    fifo = tmp_path / "suite.toml"
    os.mkfifo(fifo)
    try:
        result = within(30, lambda: cli("run", fifo, "--out", tmp_path / "out"))
    finally:
        release(fifo)
    assert result is not None, "run blocked on the FIFO"
    assert result.code == 2 and f"{fifo}: cannot read: not a regular file" in result.error_line


# --- a long label is read back as it was written ---------------------------------------------------------------


def test_a_140_kib_label_is_read_back_so_a_resume_does_not_measure_it_again(measured_csv):
    table = store.read(measured_csv)
    row = dict(table.rows[0])
    row["label"] = 'a "quoted", long label ' + "x" * (140 << 10)
    row["case_id"] = "long-label"
    store.append_row(measured_csv, row, table.header)
    again = store.read(measured_csv)
    assert not again.dropped, again.dropped
    assert [r["label"] for r in again.rows if r["case_id"] == "long-label"] == [row["label"]]


# --- wrapping a long label is linear ---------------------------------------------------------------------------


def test_show_and_plot_a_4_mb_label_in_seconds(measured, cli, tmp_path):
    _, out, csv_path = measured
    table = store.read(csv_path)
    row = dict(table.rows[0])
    row["label"] = "y" * (4 << 20)  # one word: textwrap cut it a line at a time, copying the rest each time
    row["case_id"] = "long-label"
    store.append_row(csv_path, row, table.header)
    shown = within(60, lambda: cli("show", csv_path, "--wide"))
    assert shown is not None and shown.code == 0, "show took more than 60 s"
    drawn = within(120, lambda: cli("plot", out, "--out", tmp_path / "plots"))
    assert drawn is not None and drawn.code == 0, "plot took more than 120 s"
