"""``topk_bench.attention.provenance``: which code an implementation runs where the machine decides it, said the same
way by the function, the row, meta.json and doctor. The native choice is read in fresh interpreters (a process
loads the kernels once)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from locations import ROOT
from topk_bench.attention import provenance, registry
from topk_bench.attention.kernels.native import build
from topk_bench.attention.shared import hardware

CODE_PATH = (
    "from topk_bench.attention import provenance; import torch; "
    "print(provenance.code_path('topk_fast', device='cpu', dtype=torch.float32))"
)


def fresh(code: str, **env) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, **env})  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_disabled_kernels_say_so_and_why():
    assert fresh(CODE_PATH, TOPK_BENCH_NATIVE="0").split(";")[1] == (
        "native_kernels=torch:disabled by TOPK_BENCH_NATIVE=0"
    )


@pytest.mark.skipif(build.compiler() is None, reason="no C compiler: nothing is built")
def test_built_kernels_say_their_build_key(tmp_path):
    pairs = provenance.parse(fresh(CODE_PATH, TOPK_BENCH_NATIVE_CACHE=str(tmp_path)))
    (library,) = tmp_path.glob("row_topk-*.so")
    assert pairs["native_kernels"] == f"built:{library.stem.removeprefix('row_topk-')}"


def test_a_missing_compiler_is_a_reason_not_a_silence(tmp_path):
    # A PATH without cc, gcc or clang (the interpreter is named by its full path).
    env = {"PATH": str(tmp_path), "CC": "cc", "TOPK_BENCH_NATIVE_CACHE": str(tmp_path / "cache")}
    pairs = provenance.parse(fresh(CODE_PATH, **env))
    assert pairs["native_kernels"] == "torch:no C compiler ($CC, cc, gcc or clang)"
    assert not (tmp_path / "cache").exists()


def test_half_products_follow_the_cpu_and_only_half_dtypes_have_them():
    expected = "native" if hardware.multiplies_natively(torch.bfloat16, "cpu") else "float32_copies"
    assert provenance.parse(provenance.code_path("page_topk", device="cpu", dtype=torch.bfloat16)) == {
        "half_products": expected
    }
    assert provenance.code_path("page_topk", device="cpu", dtype=torch.float32) == ""
    cuda = provenance.parse(provenance.code_path("page_topk", device="cuda", dtype=torch.bfloat16))
    assert "half_products" not in cuda  # the accelerator's own
    # Calls the Triton kernels do not take run the torch path it names (topk_bench/attention/shared/cuda_torch.py).
    assert cuda["cuda_torch"] == "batched"


def test_an_implementation_without_machine_choices_says_nothing():
    assert registry.spec("sdpa").machine_choices == ()
    assert provenance.code_path("sdpa", device="cpu", dtype=torch.float32) == ""
    # CPU kernels say nothing of another target; the decode tiles are the target's.
    cuda = provenance.parse(provenance.code_path("topk_fast", device="cuda", dtype=torch.float32))
    assert "native_kernels" not in cuda and cuda["decode_tiles"] != provenance.parse(
        provenance.code_path("topk_fast", device="cpu", dtype=torch.float32)
    ).get("decode_tiles", "")
