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

from implementations.native import build
from locations import ROOT

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C compiler: nothing is built")

STATUS = "from implementations import native; print(native.status().describe())"


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
    assert done.stdout.strip() == "not used: the library has no function f32_row_topk (a build of other sources?)"


def _c_arguments(prototype: str) -> tuple[str, ...]:
    kinds = []
    for argument in prototype.split(","):
        argument = argument.strip()
        kinds.append("ptr" if "*" in argument else "i64" if argument.startswith("int64_t") else argument)
    return tuple(kinds)


def test_the_ctypes_types_are_the_c_prototypes():
    """Every function build.SIGNATURES declares, against its C prototype: a drift is memory corruption, silently."""
    body = (ROOT / "implementations/native/row_topk_body.h").read_text()
    row_topk = re.search(r"^int F\(row_topk\)\(([^)]*)\)", body, re.M | re.S)
    key_sort = re.search(r"^int key_sort\(([^)]*)\)", (ROOT / "implementations/native/key_sort.c").read_text(), re.M)
    assert row_topk and key_sort
    for suffix in build.SUFFIXES:
        assert build.SIGNATURES[f"{suffix}_row_topk"] == ("int", _c_arguments(row_topk.group(1)))
    assert build.SIGNATURES["key_sort"] == ("int", _c_arguments(key_sort.group(1)))
    assert set(build.SIGNATURES) == {f"{s}_row_topk" for s in build.SUFFIXES} | {"key_sort"}
    # The F(name) prefixes of row_topk.c are the suffixes declared.
    prefixes = re.findall(r"#define F\(name\) (\w+)_##name", (ROOT / "implementations/native/row_topk.c").read_text())
    assert sorted(prefixes) == sorted(build.SUFFIXES)
