"""Property: no truncation or byte corruption of a results CSV makes ``run`` lose a valid row, makes
``compare`` pass damaged NEW data without saying so, or makes any command print a traceback.

Files come from a seeded generator (each failure names its seed and what was done
to the file): a valid CSV written by a real run, then cut at a random byte, or
1 to 3 bytes replaced, inserted or deleted, drawn mostly from the bytes that
matter to CSV (separators, quotes, line breaks, NUL, invalid UTF-8, digits, signs).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from faults import Cli
from runner_fakes import FakeRun
from topk_bench.errors import BadInput
from topk_bench.results import store

SUITE = """
name = "prop"
workload = "mha"
mode = "fwd"
repeats = 1
warmup = 0
[shape]
d_model = 16
heads = 2
[sweep]
seq_len = [16, 32, 64]
[[impl]]
name = "vanilla"
label = 'Vanilla, "dense"'
[[impl]]
name = "qchunk"
chunk_size = 8
"""
BYTES = [b",", b'"', b"\n", b"\r", b"\x00", b"\xff", b"\xc3", b"0", b"9", b"-", b"n", b";", b" "]


def corrupt(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    if rng.random() < 0.3:
        cut = rng.randrange(len(data))
        return data[:cut], f"cut at byte {cut}"
    done = []
    for _ in range(rng.randint(1, 3)):
        pos = rng.randrange(len(data))
        byte = rng.choice(BYTES) if rng.random() < 0.8 else bytes([rng.randrange(256)])
        op = rng.choice(["replace", "insert", "delete"])
        if op == "replace":
            data = data[:pos] + byte + data[pos + 1 :]
        elif op == "insert":
            data = data[:pos] + byte + data[pos:]
        else:
            data = data[:pos] + data[pos + 1 :]
        done.append(f"{op} {byte!r} at {pos}" if op != "delete" else f"delete at {pos}")
    return data, ", ".join(done)


def _read(path: Path) -> store.Table | None:
    try:
        return store.read(path)
    except BadInput:
        return None


@pytest.fixture
def valid(tmp_path, monkeypatch, capsys):
    """(cli, suite, the valid CSV's bytes): 6 cases, one of them an error row, labels that need quoting."""
    fake = FakeRun(status=lambda case: "error" if case.impl == "qchunk" and case.param_dict["seq_len"] == 32 else "ok")
    cli = Cli(monkeypatch, capsys, fake)
    suite = tmp_path / "prop.toml"
    suite.write_text(SUITE)
    assert cli("run", suite, "--out", tmp_path / "valid", "-q").code == 0
    data = (tmp_path / "valid" / "prop.csv").read_bytes()
    assert b'"Vanilla, ""dense"""' in data and len(store.read(tmp_path / "valid" / "prop.csv").rows) == 6
    return cli, suite, data


def check_file(cli: Cli, suite: Path, valid: bytes, seed: int, directory: Path) -> None:
    data, what = corrupt(valid, random.Random(seed))
    why = f"seed {seed}: {what}"
    directory.mkdir()
    base, new = directory / "base.csv", directory / "new.csv"
    base.write_bytes(valid)
    new.write_bytes(data)
    damaged = _read(new)

    # compare: exit 0 only when the damage left every row readable and every case there
    compared = cli("compare", base, new)
    assert compared.code in (0, 1, 2) and "Traceback" not in compared.err, (why, compared)
    if compared.code == 2:
        assert compared.error_line  # one line, no traceback
    if damaged is not None and damaged.dropped:
        assert compared.code != 0 and "left out" in compared.out, (why, compared.out)
    if compared.code == 0:
        ids = {r["case_id"] for r in store.read(base).rows}
        assert damaged is not None and not damaged.dropped, why
        assert ids <= {r["case_id"] for r in damaged.rows}, why

    shown = cli("show", new)
    assert shown.code in (0, 2) and "Traceback" not in shown.err, (why, shown)

    # run: refuse (exit 2, file untouched), or keep every row it could read and every line the damage spared
    out = directory / "out"
    out.mkdir()
    csv_path = out / "prop.csv"
    csv_path.write_bytes(data)
    ran = cli("run", suite, "--out", out, "-q")
    assert ran.code in (0, 2), (why, ran)
    if ran.code == 2:
        assert ran.error_line  # one line, no traceback
        assert csv_path.read_bytes() == data, why
        return
    after = store.read(csv_path)
    kept = {r["case_id"]: r for r in after.rows}
    assert len(kept) == len(after.rows), (why, "a case measured twice")
    for row in damaged.rows:  # damaged is readable: the run did not refuse it
        assert {c: kept.get(row["case_id"], {}).get(c) for c in damaged.header} == row, (why, row)
    original = store.read(base)
    spared = set(data.split(b"\n"))
    for line, row in zip(valid.split(b"\n")[1:], original.rows):
        if line in spared:
            assert row["case_id"] in kept, (why, "a line the damage spared is no longer read", line)
            assert [kept[row["case_id"]][c] for c in after.header[: len(original.header)]] == list(row.values()), why


def _check_many(valid, tmp_path, seeds) -> None:
    cli, suite, data = valid
    for seed in seeds:
        check_file(cli, suite, data, seed, tmp_path / f"file-{seed}")


def test_damaged_results_files_a_few(valid, tmp_path):
    """The fast loop's share: 12 files (~2 s)."""
    _check_many(valid, tmp_path, range(12))


@pytest.mark.slow
def test_damaged_results_files_many(valid, tmp_path):
    """200 more files (~25 s on 2 loaded cores)."""
    _check_many(valid, tmp_path, range(12, 212))
