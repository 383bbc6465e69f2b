"""Every row says which code produced it: ``topk_fast`` measured with its compiled kernels and again with
``TOPK_BENCH_NATIVE=0`` gives two CSVs whose ``code_path`` differs, a run without the kernels says so once, and
``compare`` warns in one line naming the cases (real runs: one child per case)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from locations import ROOT
from topk_bench.attention.kernels.native import build

SUITE = """
name = "fast"
workload = "mha"
causal = true
repeats = 3
warmup = 1
[shape]
d_model = 32
heads = 2
[sweep]
seq_len = [256, 512]
[[impl]]
name = "topk_fast"
topk = 16
chunk_size = 128
[[impl]]
name = "sdpa"
"""
FALLBACK = "warning: topk_fast runs torch's path, not its compiled kernels (disabled by TOPK_BENCH_NATIVE=0)"


def topk_bench(*args, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "topk_bench", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=600, env={**os.environ, "COLUMNS": "400", **env})  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(build.compiler() is None, reason="no C compiler: the kernels cannot be built here")
def test_kernels_and_torch_path_rows_differ_in_code_path_and_compare_says_so(tmp_path):
    suite = tmp_path / "fast.toml"
    suite.write_text(SUITE)
    cache = {"TOPK_BENCH_NATIVE_CACHE": str(tmp_path / "cache")}
    built = topk_bench("run", suite, "--out", tmp_path / "built", "-q", **cache)
    assert built.returncode == 0, built.stderr
    assert "compiled kernels" not in built.stderr
    torch_path = topk_bench("run", suite, "--out", tmp_path / "torch", "-q", TOPK_BENCH_NATIVE="0", **cache)
    assert torch_path.returncode == 0, torch_path.stderr
    assert " ".join(torch_path.stderr.split()).count(FALLBACK) == 1  # once per run, however many cases

    (key,) = [p.stem.removeprefix("row_topk-") for p in (tmp_path / "cache").glob("row_topk-*.so")]
    paths = {}
    for side in ("built", "torch"):
        rows = pd.read_csv(tmp_path / side / "fast.csv", dtype=str, keep_default_na=False)
        assert set(rows.loc[rows.impl == "sdpa", "code_path"]) == {""}  # SDPA's code is torch's, wherever it runs
        (paths[side],) = set(rows.loc[rows.impl == "topk_fast", "code_path"])
        meta = json.loads((tmp_path / side / "fast.meta.json").read_text())
        assert meta["code_path"] == {"topk_fast": {"float32": paths[side]}, "sdpa": {"float32": ""}}
    assert f"native_kernels=built:{key}" in paths["built"].split(";")
    assert "native_kernels=torch:disabled by TOPK_BENCH_NATIVE=0" in paths["torch"].split(";")

    compared = topk_bench("compare", tmp_path / "built", tmp_path / "torch")
    text = " ".join(compared.stdout.split())  # the console wraps the warning's line
    assert text.count("warning: code_path differs") == 1
    warning = text.split("warning: code_path differs")[1].split("warning:")[0]
    assert warning.startswith(" in 2 case(s) (mha/Top-k fast")
    assert f"{paths['built']} vs {paths['torch']}: the two runs ran different code" in warning
