"""The per-operation choice between the Triton kernels and the torch path on CUDA
(topk_bench/attention/kernels/triton/defaults.py): each entry of the table against the H200 measurements it cites, the
dispatch it makes (fake CUDA tensors), ``TOPK_BENCH_TRITON`` overriding it, and what ``code_path`` says."""

import csv
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import topk_bench.attention
from topk_bench.attention import provenance
from topk_bench.attention.kernels import triton as tk
from topk_bench.attention.kernels.triton import decode as td
from topk_bench.attention.kernels.triton import defaults, launch
from topk_bench.attention.shared import hardware

H200 = Path(__file__).parents[1] / "data" / "h200-2026-11-28"
fast = topk_bench.attention.get("topk_fast")
needs_triton = pytest.mark.skipif(
    launch.triton_import_failure() is not None, reason="triton is not importable (dev extra)"
)


@pytest.fixture
def unset(monkeypatch):
    monkeypatch.delenv(defaults.SWITCH_ENV, raising=False)
    return monkeypatch


def _rows(path: str, impl: str) -> dict[int, dict]:
    """``impl``'s rows of a measured CSV by swept length (kv_len or seq_len), its default options' only: the first
    of each length (after it, kv_targets has topk_fast with float32 ranking)."""
    out: dict[int, dict] = {}
    with (H200 / path).open(newline="") as f:
        for row in csv.DictReader(f):
            if row["impl"] == impl:
                out.setdefault(int(row.get("kv_len") or row["seq_len"]), row)
    return out


def _median(row: dict) -> float:
    return float(row["time_median_s"])


def _training_call():
    q = torch.empty(1, 2, 300, 8)
    return (q, q, q), dict(topk=32, dropout=0.0, key_padding_mask=None)


def _decode_call():
    return (torch.empty(1, 4, 1, 8), torch.empty(1, 2, 300, 8), torch.empty(1, 2, 300, 8))


def test_the_table_covers_each_operation_the_kernels_serve_and_one_path_per_implementation(unset):
    # Not in the table: the kernels where they serve the call, as before the table.
    assert defaults.declined_for("a_plugin") is None
    assert set(defaults.DEFAULTS) == {("topk_fast", "training"), ("topk_fast", "decode"), ("page_topk", "decode")}
    # code_path has one triton_kernels value per implementation: its operations must agree to say which ran.
    for impl in {name for name, _ in defaults.DEFAULTS}:
        assert len({path for (name, _), path in defaults.DEFAULTS.items() if name == impl}) == 1, impl


# -- one test per entry: the measurement it cites, then the dispatch it makes -----------------------------------------


def test_topk_fast_training_defaults_to_the_torch_path(unset):
    triton, torch_path = (_rows(f"{d}/topk_fast_cuda-float32.csv", "topk_fast") for d in ("triton", "torch-path"))
    assert sorted(triton) == sorted(torch_path) == [4096, 8192, 16384, 32768, 65536]
    # Faster on the torch path from 8K up (4K: 13.4 against 10.3 ms), 1.8x at 16K, 4x at 64K.
    assert all(_median(torch_path[n]) < _median(triton[n]) for n in (8192, 16384, 32768, 65536))
    assert _median(triton[16384]) / _median(torch_path[16384]) > 1.8
    # bf16: the kernels took 77x SDPA's time at 16K.
    bf16 = _rows("triton/topk_fast_cuda-bfloat16.csv", "topk_fast")[16384]
    assert _median(bf16) / _median(_rows("triton/topk_fast_cuda-bfloat16.csv", "sdpa")[16384]) > 70
    assert defaults.DEFAULTS["topk_fast", "training"] == defaults.TORCH
    args, options = _training_call()
    with FakeTensorMode(), hardware.target("cuda"):
        args = tuple(torch.empty(t.shape) for t in args)
        assert tk.unsupported(*args, **options) == defaults.DEFAULT_TORCH
        unset.setattr(tk, "topk_attention", lambda *a, **kw: pytest.fail("took the kernels"))
        fast(*args, causal=True, topk=32)  # the torch path (fake tensors: no compute)


def test_topk_fast_decode_defaults_to_the_torch_path(unset):
    triton, torch_path = (_rows(f"{d}/kv_targets-cudagraph.csv", "topk_fast") for d in ("triton", "torch-path"))
    assert _median(torch_path[131072]) < 0.5 * _median(triton[131072])  # 0.957 against 2.202 ms
    assert defaults.DEFAULTS["topk_fast", "decode"] == defaults.TORCH
    with FakeTensorMode(), hardware.target("cuda"):
        assert td.topk_fast_unsupported(*_decode_call(), key_padding_mask=None) == defaults.DEFAULT_TORCH


def test_page_topk_decode_defaults_to_the_kernels(unset):
    triton, torch_path = (_rows(f"{d}/kv_targets-cudagraph.csv", "page_topk") for d in ("triton", "torch-path"))
    t, p = triton[131072], torch_path[131072]
    assert abs(_median(t) / _median(p) - 1) < 0.02  # 0.187 against 0.184 ms: the same time...
    assert int(t["peak_bytes"]) < 0.95 * int(p["peak_bytes"])  # ...in 544.7 MiB against 597.2 MiB
    assert defaults.DEFAULTS["page_topk", "decode"] == defaults.TRITON
    options = dict(causal=True, page_size=16, group_pages=True, chunk_size=64)
    with FakeTensorMode(), hardware.target("cuda"):
        want = None if launch.triton_import_failure() is None else launch.triton_import_failure()
        assert td.page_topk_unsupported(*_decode_call(), **options) == want


def test_the_measurements_record_the_paths_they_compare():
    # Each folder ran the path it is named for (code_path), so the comparisons above compare the two paths.
    for folder, prefix in (("triton", "triton:"), ("torch-path", "torch:")):
        for path in (H200 / folder).glob("*.csv"):
            for row in csv.DictReader(path.open(newline="")):
                if row["impl"] in ("topk_fast", "page_topk"):
                    assert provenance.parse(row["code_path"])["triton_kernels"].startswith(prefix), (path, row)


# -- the switch ---------------------------------------------------------------------------------------------------


@needs_triton
def test_one_forces_the_kernels_wherever_they_take_the_call(monkeypatch):
    import triton

    monkeypatch.setenv(defaults.SWITCH_ENV, "1")
    args, options = _training_call()
    with FakeTensorMode(), hardware.target("cuda"):
        assert tk.unsupported(*(torch.empty(t.shape) for t in args), **options) is None
        assert td.topk_fast_unsupported(*_decode_call(), key_padding_mask=None) is None
        # ...but not past their limits: dropout stays on the torch path.
        assert tk.unsupported(*(torch.empty(t.shape) for t in args), **options | {"dropout": 0.1}) == "dropout"
    for impl in ("topk_fast", "page_topk"):
        assert tk.status(impl) == f"triton:{triton.__version__}"


def test_zero_disables_them_everywhere(monkeypatch, recwarn):
    monkeypatch.setenv(defaults.SWITCH_ENV, "0")
    assert defaults.declined_for("a_plugin") == "disabled by TOPK_BENCH_TRITON=0"  # in the table or not
    options = dict(causal=True, page_size=16, group_pages=True, chunk_size=64)
    with FakeTensorMode(), hardware.target("cuda"):
        assert td.page_topk_unsupported(*_decode_call(), **options) == "disabled by TOPK_BENCH_TRITON=0"
    assert tk.status("page_topk") == "torch:disabled by TOPK_BENCH_TRITON=0"
    assert not recwarn.list


@pytest.mark.parametrize("value", ["yes", "2", " 1", "true"])
def test_a_bad_value_is_an_error_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(defaults.SWITCH_ENV, value)
    message = rf"^TOPK_BENCH_TRITON='{value}': expected 1 \(the Triton kernels wherever they take the call\), 0 "
    with pytest.raises(ValueError, match=message):
        provenance.code_path("topk_fast", device="cuda", dtype=torch.float32)
    with FakeTensorMode(), hardware.target("cuda"), pytest.raises(ValueError, match=message):
        td.topk_fast_unsupported(*_decode_call(), key_padding_mask=None)
    assert provenance.code_path("topk_fast", device="cpu", dtype=torch.float32)  # a CPU row never reads it


def test_code_path_says_why_the_torch_path_ran(unset):
    pairs = provenance.parse(provenance.code_path("topk_fast", device="cuda", dtype=torch.bfloat16))
    assert pairs["triton_kernels"] == "torch:default (faster on an H200)"
    assert pairs["cuda_torch"] == "batched"
    assert not set(defaults.DEFAULT_TORCH) & {";", "="}  # the column's separators
    page = provenance.parse(provenance.code_path("page_topk", device="cuda", dtype=torch.bfloat16))
    assert page["triton_kernels"] == tk.status("page_topk") != pairs["triton_kernels"]


@pytest.mark.parametrize("variable, value", [(defaults.SWITCH_ENV, "yes"), ("TOPK_BENCH_CUDA_TORCH", "fast")])
def test_a_run_planned_with_a_bad_switch_is_bad_input(tmp_path, monkeypatch, variable, value):
    from topk_bench.errors import BadInput
    from topk_bench.run.plan import plan
    from topk_bench.run.resolve import Flags

    monkeypatch.setenv(variable, value)
    suite = tmp_path / "s.toml"
    suite.write_text(
        'name = "s"\nworkload = "mha"\nmode = "fwd_bwd"\ncausal = true\n[shape]\nbatch = 1\nd_model = 128\n'
        'heads = 2\n[sweep]\nseq_len = [256]\n[[impl]]\nname = "topk_fast"\n'
    )
    with pytest.raises(BadInput, match=rf"^{variable}='{value}': expected "):
        plan(suite, Flags(predict=True, device="cuda"), yes=True)
