"""The compiled kernels are built and loaded safely: a private cache, no library another user could have written,
a compiler under a time limit, no partial file left behind, and the ctypes types of every function the C
prototypes' own. Each case runs in a fresh interpreter (a process loads the library once)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from locations import ROOT
from topk_bench.attention.kernels.native import build

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C compiler: nothing is built")

STATUS = "from topk_bench.attention.kernels import native; print(native.status().describe())"


def fresh(code: str, cache: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "TOPK_BENCH_NATIVE_CACHE": str(cache), **env})  # fmt: skip


def built_key(cache: Path) -> str:
    done = fresh(STATUS, cache)
    assert done.returncode == 0 and done.stdout.startswith("built "), done.stderr
    return done.stdout.split()[1]


def test_a_new_cache_directory_is_this_users_alone(tmp_path):
    cache = tmp_path / "cache" / "native"
    key = built_key(cache)
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    library = cache / f"row_topk-{key}.so"
    assert library.stat().st_uid == os.getuid() and not library.stat().st_mode & 0o022


def test_a_library_others_may_have_written_is_not_loaded_and_is_built_beside(tmp_path):
    cache = tmp_path / "native"
    key = built_key(cache)
    planted = cache / f"row_topk-{key}.so"
    planted.write_bytes(b"not a library: loading it would fail")  # the cached name, content of someone else's
    planted.chmod(0o666)
    done = fresh(STATUS, cache)
    assert done.stdout.strip() == f"built {key}", done.stderr
    assert f"not loading {planted}: writable by group or others (mode 666); building beside it" in done.stderr
    assert planted.read_bytes().startswith(b"not a library")  # left as it was
    assert (cache / f"row_topk-{key}-uid{os.getuid()}.so").is_file()


@pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user needs root")
def test_a_library_owned_by_another_user_is_not_loaded(tmp_path):
    cache = tmp_path / "native"
    key = built_key(cache)
    planted = cache / f"row_topk-{key}.so"
    os.chown(planted, 65534, 65534)  # nobody's now, however it was made
    done = fresh(STATUS, cache)
    assert done.stdout.strip() == f"built {key}", done.stderr
    assert f"not loading {planted}: owned by uid 65534, not 0; building beside it" in done.stderr


def test_a_cache_directory_others_may_write_is_not_used(tmp_path):
    cache = tmp_path / "native"
    cache.mkdir(mode=0o777)
    cache.chmod(0o777)
    done = fresh(STATUS, cache)
    assert done.stdout.startswith("built "), done.stderr
    assert f"not building in {cache}: writable by group or others (mode 777)" in done.stderr
    assert not list(cache.iterdir())


def test_a_compiler_that_never_finishes_costs_its_time_limit_and_leaves_no_process(tmp_path):
    sleeper = tmp_path / "cc"
    sleeper.write_text(f"#!/bin/sh\necho $$ >> {tmp_path / 'pids'}\nexec sleep 600\n")
    sleeper.chmod(0o755)
    started = time.monotonic()
    done = fresh(STATUS, tmp_path / "native", CC=str(sleeper), TOPK_BENCH_NATIVE_TIMEOUT="2")
    took = time.monotonic() - started
    assert done.stdout.strip() == f"not used: {sleeper} did not finish in 2 s (TOPK_BENCH_NATIVE_TIMEOUT)", done
    assert took < 60, took  # the interpreter's start and torch's import, and 2 s
    for pid in (tmp_path / "pids").read_text().split():
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_a_build_killed_midway_leaves_a_partial_file_the_next_build_removes(tmp_path):
    cache = tmp_path / "native"
    cache.mkdir(mode=0o700)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = cache / f".row_topk-0123456789abcdef.{dead.stdout.strip()}.x1y2z3.partial.so"
    left.write_bytes(b"half a library")
    ours = cache / f".row_topk-0123456789abcdef.{os.getpid()}.a1b2c3.partial.so"  # a build still running
    ours.write_bytes(b"being written")
    assert fresh(STATUS, cache).stdout.startswith("built ")
    assert not left.exists() and ours.exists()


def test_a_library_without_the_kernels_functions_is_not_used(tmp_path):
    cache = tmp_path / "native"
    key = built_key(cache)
    library = cache / f"row_topk-{key}.so"
    source = tmp_path / "other.c"
    source.write_text("int key_sort(void) { return 0; }\n")
    subprocess.run([build.compiler(), "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    library.chmod(0o700)
    done = fresh(STATUS, cache)
    assert done.stdout.strip() == (
        "not used: the library has no function f32_row_topk (a build of other sources?); removed, the next run "
        "builds it again"
    )
    assert not library.exists()


def test_a_build_is_keyed_by_the_cpus_flags(monkeypatch):
    """-march=native: a library built on an AVX-512 CPU would die of an illegal instruction on an AVX2 one, so a cache
    shared by both (a home directory on NFS) keys them apart."""
    cc = build.compiler()
    here = build.build_key(cc)
    monkeypatch.setattr(build, "_cpu_flags", lambda: "flags\t\t: fpu sse sse2 avx avx2 fma bmi2")  # an AVX2-only one
    avx2 = build.build_key(cc)
    monkeypatch.setattr(build, "_cpu_flags", lambda: "flags\t\t: fpu sse sse2 avx avx2 fma bmi2 avx512f avx512bw")
    assert len({here, avx2, build.build_key(cc)}) == 3


def _c_arguments(prototype: str) -> tuple[str, ...]:
    kinds = []
    for argument in prototype.split(","):
        argument = argument.strip()
        kinds.append("ptr" if "*" in argument else "i64" if argument.startswith("int64_t") else argument)
    return tuple(kinds)


def test_the_ctypes_types_are_the_c_prototypes():
    """Every function build.SIGNATURES declares, against its C prototype: a drift is memory corruption, silently."""
    body = (ROOT / "topk_bench/attention/kernels/native/row_topk_body.h").read_text()
    row_topk = re.search(r"^int F\(row_topk\)\(([^)]*)\)", body, re.M | re.S)
    key_sort = re.search(
        r"^int key_sort\(([^)]*)\)", (ROOT / "topk_bench/attention/kernels/native/key_sort.c").read_text(), re.M
    )
    isa = re.search(
        r"^int row_topk_isa\(([^)]*)\)",
        (ROOT / "topk_bench/attention/kernels/native/row_topk_scan.h").read_text(),
        re.M,
    )
    assert row_topk and key_sort and isa
    for suffix in build.SUFFIXES:
        assert build.SIGNATURES[f"{suffix}_row_topk"] == ("int", _c_arguments(row_topk.group(1)))
    assert build.SIGNATURES["key_sort"] == ("int", _c_arguments(key_sort.group(1)))
    assert build.SIGNATURES["row_topk_isa"] == ("int", _c_arguments(isa.group(1)))
    assert set(build.SIGNATURES) == {f"{s}_row_topk" for s in build.SUFFIXES} | {"key_sort", "row_topk_isa"}
    # The F(name) prefixes of row_topk.c are the suffixes declared.
    prefixes = re.findall(
        r"#define F\(name\) (\w+)_##name", (ROOT / "topk_bench/attention/kernels/native/row_topk.c").read_text()
    )
    assert sorted(prefixes) == sorted(build.SUFFIXES)


# --- a failed build of any kind is the torch path, said in one line, tried once per run -------------------------


def fake_compiler(tmp_path: Path, body: str) -> Path:
    """A ``cc`` that logs each call (``calls``) and then does ``body`` (a shell snippet)."""
    cc = tmp_path / "cc"
    cc.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "calls"}\n{body}\n')
    cc.chmod(0o755)
    return cc


def calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls"
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.slow
def test_a_version_that_is_not_utf8_is_no_traceback(tmp_path):
    real = build.compiler()
    cc = fake_compiler(
        tmp_path, f'[ "$1" = --version ] && {{ printf "cc \\377\\376 1.0\\n"; exit 0; }}\nexec {real} "$@"'
    )
    done = fresh(STATUS, tmp_path / "native", CC=str(cc))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.startswith("built "), done.stdout


@pytest.mark.slow
def test_a_compiler_that_is_no_program_is_the_torch_path(tmp_path):
    cc = tmp_path / "cc"
    cc.write_bytes(b"\x7fELF but not a program")
    cc.chmod(0o755)
    done = fresh(STATUS, tmp_path / "native", CC=str(cc))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.strip() == f"not used: {cc} cannot run: Exec format error"


@pytest.mark.slow
def test_a_library_that_does_not_load_is_removed_and_built_again_by_the_next_run(tmp_path):
    cache = tmp_path / "native"
    key = built_key(cache)
    library = cache / f"row_topk-{key}.so"
    library.write_bytes(b"cut short by a full disk")  # this user's, mode 700: trusted, but no library
    done = fresh(STATUS, cache)
    assert done.stdout.startswith(f"not used: {library} does not load: "), done.stdout
    assert done.stdout.strip().endswith("; removed, the next run builds it again")
    assert not library.exists()
    assert built_key(cache) == key and library.is_file()


@pytest.mark.slow
def test_a_hanging_compiler_is_announced_and_tried_once_per_run(tmp_path):
    cc = fake_compiler(tmp_path, '[ "$1" = --version ] && { echo "cc 1.0"; exit 0; }\nexec sleep 600')
    # The run's process, then one it starts (a template, a child): the second does not try again.
    code = (
        f"{STATUS}\nimport subprocess, sys\n"
        f"print(subprocess.run([sys.executable, '-c', {STATUS!r}], capture_output=True, text=True).stdout, end='')"
    )
    started = time.monotonic()
    done = fresh(code, tmp_path / "native", CC=str(cc), TOPK_BENCH_NATIVE_TIMEOUT="2")
    took = time.monotonic() - started
    reason = f"not used: {cc} did not finish in 2 s (TOPK_BENCH_NATIVE_TIMEOUT)"
    assert done.stdout.splitlines() == [reason, reason], done
    assert [c for c in calls(tmp_path) if c != "--version"] and len(calls(tmp_path)) == 2, calls(tmp_path)
    assert "topk_bench.attention.kernels.native: compiling the native kernels, at most 2 s" in done.stderr
    assert took < 90, took


@pytest.mark.slow
def test_a_cache_that_is_a_link_of_this_users_is_followed(tmp_path):
    real = tmp_path / "elsewhere" / "native"
    real.parent.mkdir()
    real.mkdir(mode=0o700)
    link = tmp_path / "native"
    link.symlink_to(real)
    done = fresh(STATUS, link)
    assert done.stdout.startswith("built "), done.stderr
    assert "not building in" not in done.stderr
    assert [p.name for p in real.iterdir()] == [f"row_topk-{done.stdout.split()[1]}.so"]


@pytest.mark.slow
def test_a_private_directory_is_removed_when_the_process_ends(tmp_path):
    cache = tmp_path / "native"
    cache.mkdir(mode=0o777)
    cache.chmod(0o777)  # not used: the build goes to a directory of the process's own
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = fresh(STATUS, cache, TMPDIR=str(scratch))
    assert done.stdout.startswith("built "), done.stderr
    assert not list(scratch.iterdir())
