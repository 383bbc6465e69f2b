"""The compiled row top-k (topk_bench/attention/kernels/native): torch.topk's values, the lowest columns at ties,
written in
column order, in place, on every path of the kernel and at every level of its filter."""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

from topk_bench.attention.kernels import native
from topk_bench.attention.methods.topk_fast import _ordered_bits

pytestmark = pytest.mark.skipif(not native.available(torch.float32), reason="no C compiler: no compiled kernel")

LEVELS = ("portable", "avx2", "avx512")
_BITS = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
}


def _run(scores, k, index_dtype=torch.int64, groups=1, base=0):
    outer, inner, _ = scores.shape
    values = torch.empty(outer, inner, k, dtype=scores.dtype)
    indices = torch.empty(outer, inner, k, dtype=index_dtype)
    native.row_topk_(scores, k, values, indices, groups, base)
    return values, indices


def _ranked(scores):
    """What the kernel ranks: half floats by their bits made ordered, other floats with -0 as +0, ints as they are."""
    if scores.dtype in (torch.bfloat16, torch.float16):
        return _ordered_bits(scores)
    return torch.where(scores == 0, torch.zeros_like(scores), scores) if scores.is_floating_point() else scores


def expected_columns(scores, k):
    """The first k of a stable descending sort (NaN first, as torch.topk ranks it), in ascending column order."""
    return _ranked(scores).sort(dim=-1, descending=True, stable=True).indices[..., :k].sort(dim=-1).values


def _check_against_topk(scores, k, values, indices, groups=1, base=0):
    """Exactly the columns of expected_columns, their scores bit for bit, and torch.topk's values."""
    offset = (torch.arange(scores.shape[0]) // groups * base).view(-1, 1, 1)
    columns = indices.long() - offset
    want = expected_columns(scores, k)
    assert torch.equal(columns, want), f"{int((columns != want).sum())} columns differ"
    bits = _BITS.get(scores.dtype)
    picked = scores.gather(-1, columns)
    assert torch.equal(values.view(bits), picked.view(bits)) if bits else torch.equal(values, picked)
    if scores.dtype not in (torch.bfloat16, torch.float16):  # half floats rank by bits, not as torch.topk
        top = scores.topk(k, dim=-1).values
        got = values.sort(dim=-1, descending=True).values  # sort puts NaN first when descending, as topk does
        fill = {"nan": 7.0, "posinf": 8.0, "neginf": -8.0} if scores.is_floating_point() else None
        assert torch.equal(got.nan_to_num(**fill), top.nan_to_num(**fill)) if fill else torch.equal(got, top)


@pytest.fixture
def level():
    """Sets the filter's level for a test (``level(name)``), back to the highest after it."""
    yield native.filter_levels
    native.filter_levels("avx512")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "width,k", [(1, 1), (7, 3), (16, 16), (40, 5), (300, 17), (1000, 128), (5000, 128), (20000, 64), (3000, 1500)]
)
def test_equals_torch_topk_on_random_rows(dtype, width, k):
    torch.manual_seed(width * 7 + k)
    scores = torch.randn(3, 5, width, dtype=dtype)
    values, indices = _run(scores, k)
    _check_against_topk(scores, k, values, indices)


@pytest.mark.parametrize("order", ["ascending", "descending", "constant", "two_values"])
def test_adversarial_orders_and_ties(order):
    """Ascending rows make every value a candidate (the buffer's cuts); ties at the k-th value."""
    width, k = 6000, 100
    base = torch.randn(4, width, dtype=torch.float64)
    scores = (
        {
            "ascending": base.sort(-1).values,
            "descending": base.sort(-1, descending=True).values,
            "constant": torch.full((4, width), 0.5, dtype=torch.float64),
            "two_values": (base > 1.5).double(),  # ~6.7% ones: the k-th value is 1.0 or 0.0 with many ties
        }[order]
        .unsqueeze(0)
        .contiguous()
    )
    values, indices = _run(scores, k)
    _check_against_topk(scores, k, values, indices)


def test_infinities_and_nan_rank_as_torch_topk():
    torch.manual_seed(1)
    width, k = 2000, 64
    scores = torch.randn(1, 6, width)
    scores[0, 0, 30:] = float("-inf")  # fewer than k finite values: -inf ones fill the top-k
    scores[0, 1, :] = float("-inf")  # all -inf
    scores[0, 2, ::97] = float("inf")  # +inf values (the exact bound)
    scores[0, 3, 5] = float("nan")  # NaN ranks highest
    scores[0, 4, ::3] = float("nan")  # more NaN than k
    scores[0, 5, 1000:] = float("-inf")  # a causal-like row: a masked suffix
    values, indices = _run(scores, k)
    _check_against_topk(scores, k, values, indices)


def test_int16_ranks():
    torch.manual_seed(2)
    scores = torch.randint(-32768, 32767, (2, 3, 4000), dtype=torch.int16)
    scores[0, 0, :] = 7  # all tied
    values, indices = _run(scores, 200)
    _check_against_topk(scores, 200, values, indices)


def test_writes_into_slices_with_head_offsets():
    """A strided [outer, inner, width] tile into rows r0:r1 of [outer, Lq, k] results, indices
    o // groups * base + j."""
    torch.manual_seed(3)
    outer, lq, width, k, groups, base = 6, 10, 700, 32, 3, 700
    tile = torch.randn(outer, 8, width + 5)[:, 2:6, :width]  # rows 2..5 of a wider buffer: strided
    values = torch.full((outer, lq, k), -1.0)
    indices = torch.full((outer, lq, k), -1, dtype=torch.int32)
    native.row_topk_(tile, k, values[:, 3:7], indices[:, 3:7], groups, base)
    _check_against_topk(tile, k, values[:, 3:7], indices[:, 3:7], groups, base)
    untouched = torch.ones(lq, dtype=torch.bool)
    untouched[3:7] = False
    assert (values[:, untouched] == -1).all() and (indices[:, untouched] == -1).all()


def test_threads_split_rows_the_same():
    torch.manual_seed(4)
    scores = torch.randn(4, 50, 3000)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _run(scores, 100)
        torch.set_num_threads(2)
        two = _run(scores, 100)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


def test_bad_arguments_raise():
    scores = torch.randn(2, 3, 50)
    with pytest.raises(ValueError, match="k=51 outside"):
        _run(scores, 51)
    with pytest.raises(ValueError, match="dtypes"):
        native.row_topk_(scores, 5, torch.empty(2, 3, 5, dtype=torch.float64), torch.empty(2, 3, 5, dtype=torch.int64))
    with pytest.raises(ValueError, match="last dimension must be contiguous"):
        native.row_topk_(
            scores.transpose(1, 2).contiguous().transpose(1, 2),
            5,
            torch.empty(2, 3, 5),
            torch.empty(2, 3, 5, dtype=torch.int64),
        )


def test_fake_tensors_allocate_nothing():
    """The predict backend runs the op on FakeTensors: shapes checked, no output, no allocation."""
    with FakeTensorMode():
        scores = torch.empty(2, 3, 500)
        values, indices = torch.empty(2, 3, 10), torch.empty(2, 3, 10, dtype=torch.int64)
        native.row_topk_(scores, 10, values, indices)
        with pytest.raises(ValueError, match="do not fit"):
            native.row_topk_(scores, 11, values, indices)


def _fresh_python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**os.environ, **env}
    )


def test_disabled_or_without_compiler_falls_back(tmp_path):
    code = "import torch; from topk_bench.attention.kernels import native; print(native.available(torch.float32))"
    off = _fresh_python(code, TOPK_BENCH_NATIVE="0")
    assert off.returncode == 0 and off.stdout.strip() == "False"
    broken = _fresh_python(code, CC="false", TOPK_BENCH_NATIVE_CACHE=str(tmp_path))
    assert broken.returncode == 0 and broken.stdout.strip() == "False"
    assert "--version failed (exit 1): not a C compiler?); using torch's" in broken.stderr
    assert not list(tmp_path.glob("*.so")), "a failed build left a library behind"


def test_builds_once_into_the_cache(tmp_path):
    code = "import torch; from topk_bench.attention.kernels import native; print(native.available(torch.float64))"
    first = _fresh_python(code, TOPK_BENCH_NATIVE_CACHE=str(tmp_path))
    assert first.returncode == 0 and first.stdout.strip() == "True", first.stderr
    built = list(tmp_path.glob("row_topk-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    again = _fresh_python(code, TOPK_BENCH_NATIVE_CACHE=str(tmp_path))
    assert again.stdout.strip() == "True" and built[0].stat().st_mtime_ns == stamp


@pytest.mark.parametrize(
    "causal,groups,padded", [(True, 1, False), (False, 1, True), (True, 3, False), (True, 2, True)]
)
def test_topk_fast_same_with_and_without_the_kernel(monkeypatch, causal, groups, padded):
    """topk_fast's outputs and gradients (float64) are the same through the kernels and through torch.topk/sort."""
    from topk_bench.attention.methods.topk_fast import topk_fast_attention

    torch.manual_seed(5)
    b, h, lq, d = 2, 6, 300, 16
    q = torch.randn(b, h, lq, d, dtype=torch.float64, requires_grad=True)
    k = torch.randn(b, h // groups, lq, d, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, h // groups, lq, d, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(b, lq, dtype=torch.bool)
    if padded:
        mask[1, -37:] = True
    grad = torch.randn(b, h, lq, d, dtype=torch.float64)

    def run():
        out = topk_fast_attention(
            q, k, v, causal=causal, topk=40, chunk_size=128, key_padding_mask=mask if padded else None
        )
        return (out, *torch.autograd.grad(out, (q, k, v), grad))

    compiled = run()
    monkeypatch.setattr(native, "_library", lambda: None)  # neither kernel: torch.topk, torch.sort
    assert not native.available(torch.float64) and not native.built()
    plain = run()
    for a, b_ in zip(compiled, plain):
        torch.testing.assert_close(a, b_, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("threads", [1, 2])
def test_key_sort_is_a_stable_sort_carrying_rows_and_weights(dtype, threads):
    torch.manual_seed(6)
    lo, nkeys, n, per_row = 1000, 300, 300_000, 7
    keys = torch.randint(lo, lo + nkeys - 20, (n,), dtype=dtype)  # the last 20 keys have no entry
    w, ds = torch.randn(n, dtype=torch.float64), torch.randn(n).to(torch.bfloat16)
    rows, starts = torch.empty(n, dtype=torch.int64), torch.empty(nkeys + 1, dtype=torch.int64)
    w_out, ds_out = torch.empty_like(w), torch.empty_like(ds)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        native.key_sort_(keys, lo, per_row, rows, starts, w, w_out, ds, ds_out)
    finally:
        torch.set_num_threads(previous)
    sorted_keys, order = torch.sort(keys, stable=True)
    assert torch.equal(rows, order // per_row)
    assert torch.equal(w_out, w[order]) and torch.equal(ds_out, ds[order])
    assert torch.equal(starts, torch.searchsorted(sorted_keys, torch.arange(lo, lo + nkeys + 1, dtype=dtype)))
    assert starts[-21:].eq(n).all()
    # without carried arrays: the same rows
    alone = torch.empty(n, dtype=torch.int64)
    native.key_sort_(keys, lo, per_row, alone, starts)
    assert torch.equal(alone, rows)


def test_key_sort_rejects_a_key_out_of_range():
    keys = torch.tensor([3, 4, 9], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"a key outside \[3, 8\)"):
        native.key_sort_(keys, 3, 1, torch.empty(3, dtype=torch.int64), torch.empty(6, dtype=torch.int64))
    with pytest.raises(ValueError, match="needs both its input and its output"):
        native.key_sort_(
            keys, 3, 1, torch.empty(3, dtype=torch.int64), torch.empty(7, dtype=torch.int64), torch.randn(3)
        )


_FORK_SCRIPT = """
import os, sys, torch
from topk_bench.attention.kernels import native
assert native.available(torch.float32)  # built and loaded; no parallel region has run in this process
pid = os.fork()
if pid == 0:
    torch.set_num_threads(2)
    scores = torch.randn(2, 64, 1000)
    values, indices = torch.empty(2, 64, 50), torch.empty(2, 64, 50, dtype=torch.int64)
    native.row_topk_(scores, 50, values, indices)
    same = torch.equal(values.sort(-1).values, scores.topk(50, dim=-1).values.sort(-1).values)
    os._exit(0 if same else 3)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_runs_the_kernel_on_threads():
    """As the harness's template: build and load the kernels, run no parallel region, fork; the child runs the
    kernel on torch's two threads (GNU OpenMP's pool starts in the child, as for torch's own ops)."""
    result = _fresh_python(_FORK_SCRIPT)
    assert result.returncode == 0 and result.stdout.strip() == "child 0", result.stderr


@pytest.mark.slow  # compiles (inductor, a minute on a loaded 2-core machine)
def test_topk_fast_compiles_through_the_kernels():
    """compile = true: dynamo takes the custom ops as they are; the compiled step gives the eager one's results."""
    from topk_bench.attention.methods.topk_fast import topk_fast_attention

    torch.manual_seed(7)
    q = torch.randn(1, 8, 1, 64, dtype=torch.bfloat16)
    k, v = torch.randn(1, 2, 2048, 64, dtype=torch.bfloat16), torch.randn(1, 2, 2048, 64, dtype=torch.bfloat16)
    step = torch.compile(lambda q, k, v: topk_fast_attention(q, k, v, causal=True, topk=128))
    torch.testing.assert_close(step(q, k, v), topk_fast_attention(q, k, v, causal=True, topk=128), rtol=0, atol=0)
    qt, kt, vt = (torch.randn(1, 4, 200, 32, requires_grad=True) for _ in range(3))
    layer = torch.compile(lambda a, b, c: topk_fast_attention(a, b, c, causal=True, topk=32, chunk_size=64))
    compiled, eager = layer(qt, kt, vt), topk_fast_attention(qt, kt, vt, causal=True, topk=32, chunk_size=64)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
    grads = [torch.autograd.grad(out.sum(), (qt, kt, vt)) for out in (compiled, eager)]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# --- the contract, exactly: ties, order, every path and level of the kernel -----------------------------------


def test_the_lowest_columns_win_ties_and_come_in_column_order():
    row = torch.tensor([[[1.0, 3.0, 3.0, 2.0, 3.0, -0.0, 0.0, float("nan")]]])
    cases = {1: [7], 2: [1, 7], 3: [1, 2, 7], 4: [1, 2, 4, 7], 5: [1, 2, 3, 4, 7], 7: [0, 1, 2, 3, 4, 5, 7]}
    for k, columns in cases.items():
        values, indices = _run(row, k)
        assert indices.flatten().tolist() == columns, k
        assert torch.equal(values.nan_to_num(9.0), row[..., columns].nan_to_num(9.0))


_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int16)


@st.composite
def tiles(draw):
    """Two rows of one dtype: continuous or few distinct values (ties), with -inf tails, NaN, +inf, both zeros."""
    dtype = draw(st.sampled_from(_DTYPES))
    width = draw(st.one_of(st.integers(1, 300), st.integers(300, 5000), st.sampled_from([16384, 40000])))
    k = draw(st.one_of(st.integers(1, min(width, 256)), st.integers(1, width)))
    distinct = draw(st.sampled_from([0, 2, 5, 50]))  # 0: continuous
    special = draw(st.sampled_from(["none", "masked_tail", "nan", "inf", "zeros", "all"]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    x = torch.randn(2, width, generator=g, dtype=torch.float64)
    if distinct:
        x = torch.randint(0, distinct, (2, width), generator=g).double()
    if dtype == torch.int16:
        return (x * 997).clamp(-32768, 32767).to(torch.int16).unsqueeze(0), k
    if special in ("masked_tail", "all"):
        x[:, width // 2 :] = float("-inf")  # a causal row: fewer than k allowed keys when k > width / 2
    if special in ("nan", "all"):
        x[0, torch.randint(0, width, (1 + width // 50,), generator=g)] = float("nan")
    if special in ("inf", "all"):
        x[1, ::7] = float("inf")
    if special in ("zeros", "all"):
        x[:, ::3] = 0.0
        x[:, 1::3] = -0.0
    return x.to(dtype).unsqueeze(0), k


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(tiles())
def test_property_the_first_k_of_a_stable_sort_at_every_level(tile):
    scores, k = tile
    try:
        for name in LEVELS:
            native.filter_levels(name)
            _check_against_topk(scores, k, *_run(scores, k))
    finally:
        native.filter_levels("avx512")


@pytest.mark.parametrize(
    "dtype,width,k",
    [
        (torch.float32, 16384, 128),
        (torch.float32, 4096, 128),
        (torch.bfloat16, 131072, 8192),
        (torch.float32, 70000, 8192),
    ],
)
def test_every_level_keeps_the_same_columns_on_the_rows_topk_fast_selects_from(level, dtype, width, k):
    """A training tile's rows (causal: a masked tail) and a decode step's (k = 1/16 of the keys: the sample's path)."""
    torch.manual_seed(width + k)
    scores = torch.randn(2, 8, width).to(dtype)
    scores[0, :, width - 300 :] = float("-inf")
    picked = {}
    for name in LEVELS:
        level(name)
        picked[name] = _run(scores, k)
        _check_against_topk(scores, k, *picked[name])
    assert all(torch.equal(picked[name][1], picked["avx512"][1]) for name in LEVELS)


def test_a_level_above_this_cpus_runs_the_highest_it_has(level):
    assert set(level("portable").values()) == {"portable"}
    highest = level("avx512")
    assert set(level("avx2").values()) <= {"avx2", "portable"}
    assert all(LEVELS.index(highest[width]) >= LEVELS.index(used) for width, used in level("avx2").items())
    with pytest.raises(ValueError, match="cap 'sse9' is none of portable, avx2, avx512"):
        level("sse9")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_scores_rank_as_their_int16_bits(dtype):
    """bfloat16 and float16 as they are pick what their ordered int16 bits pick (topk_fast's decode ranking)."""
    torch.manual_seed(8)
    scores = torch.randn(2, 4, 20000).mul(3).to(dtype)
    scores[0, 0, ::5] = -0.0
    scores[1, 1, 100:] = float("-inf")
    values, indices = _run(scores, 1000)
    rank_values, rank_indices = _run(_ordered_bits(scores), 1000)
    assert torch.equal(indices, rank_indices)
    assert torch.equal(values.view(torch.int16), _ordered_bits(rank_values))
    _check_against_topk(scores, 1000, values, indices)


def test_a_sample_that_misjudges_the_row_is_caught():
    """k = 1/16 of the row: the threshold comes from 16 runs of 64 columns (row_topk.c's plan_for). A row whose
    high scores sit exactly in those runs sets it too high (fewer than k pass: the groups' bound is taken); one
    whose runs hold its lowest scores sets it too low (every column passes: the candidates are cut, again and
    again)."""
    width, k = 65536, 4096
    runs = torch.cat([torch.arange(64) + c * (width - 64) // 15 for c in range(16)])
    torch.manual_seed(9)
    high, low = torch.randn(1, 2, width), torch.randn(1, 2, width)
    high[..., runs] = 10.0
    low[..., runs] = -10.0
    for scores in (high, low):
        _check_against_topk(scores, k, *_run(scores, k))


_LEVEL_SCRIPT = """
import torch
from topk_bench.attention.kernels import native
x = torch.randn(3, 4, 5000, generator=torch.Generator().manual_seed(0))
v, i = torch.empty(3, 4, 64), torch.empty(3, 4, 64, dtype=torch.int64)
native.row_topk_(x, 64, v, i)
want = x.sort(dim=-1, descending=True, stable=True).indices[..., :64].sort(dim=-1).values
print(native.filter_levels(), torch.equal(i, want))
"""


def test_the_isa_variable_caps_the_filter_of_a_run():
    portable = _fresh_python(_LEVEL_SCRIPT, TOPK_BENCH_NATIVE_ISA="portable")
    assert portable.stdout.strip() == "{'32-bit': 'portable', '16-bit': 'portable'} True", portable.stderr
    unknown = _fresh_python(_LEVEL_SCRIPT, TOPK_BENCH_NATIVE_ISA="sse9")
    assert unknown.stdout.strip().endswith(" True"), unknown.stderr
    assert "TOPK_BENCH_NATIVE_ISA='sse9' is none of portable, avx2, avx512; using avx512" in unknown.stderr


def _cpu_has(*flags: str) -> bool:
    try:
        line = next(x for x in open("/proc/cpuinfo").read().splitlines() if x.startswith("flags"))
    except (OSError, StopIteration):
        return False
    return set(flags) <= set(line.split())


@pytest.mark.parametrize(
    "march,needs",
    [
        ("x86-64", ()),  # no AVX: the portable loops only
        ("x86-64-v3", ("avx2", "bmi2", "fma")),  # an AVX2-only EPYC
        (
            "x86-64-v4",
            ("avx512f", "avx512bw", "avx512vl", "avx512dq"),
        ),  # AVX-512 without VBMI2: 16-bit scores take AVX2
    ],
)
def test_a_build_for_an_older_cpu_keeps_the_same_columns(tmp_path, monkeypatch, march, needs):
    """The kernels as -march=native builds them on another CPU kind (one this CPU can run), loaded in place of
    this one's: the same columns on training and decode rows, every dtype."""
    from topk_bench.attention.kernels.native import build

    cc = build.compiler()
    if platform.machine() != "x86_64" or not _cpu_has(*needs):
        pytest.skip(f"this CPU cannot run a {march} build")
    library = tmp_path / f"row_topk-{march}.so"
    flags = [f"-march={march}" if f == "-march=native" else f for f in build.flags()]
    done = subprocess.run([cc, *flags, "-o", str(library), *map(str, build.SOURCES)], capture_output=True, text=True)
    if done.returncode != 0 and "march" in done.stderr:
        pytest.skip(f"{cc} does not know -march={march}")
    assert done.returncode == 0, done.stderr
    torch.manual_seed(10)
    rows = [(torch.randn(2, 4, 16384), 128), (torch.randn(1, 4, 40000).bfloat16(), 2500), (torch.randn(1, 3, 700), 300)]
    rows[0][0][0, :, 16000:] = float("-inf")
    here = [_run(scores, k) for scores, k in rows]
    monkeypatch.setattr(native, "_library", lambda: build.declare(ctypes.CDLL(str(library))))
    for (scores, k), (values, indices) in zip(rows, here):
        other = _run(scores, k)
        _check_against_topk(scores, k, *other)
        assert torch.equal(other[1], indices) and torch.equal(
            other[0].view(_BITS[scores.dtype]), values.view(_BITS[scores.dtype])
        )
