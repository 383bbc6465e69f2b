import os

# Triton kernels run on CPU tensors in Triton's interpreter, chosen when triton is imported (its @jit returns an
# interpreted function then, its standard library included): set before anything imports it. No test needs a GPU.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

# Deterministic, quiet CPU runs: two cores at most on this project's machines.
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture
def f64():
    """Run a test in float64 (numerical agreement is checked at 1e-10)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield torch.float64
    torch.set_default_dtype(previous)


@pytest.fixture(autouse=True)
def _restore_registry():
    """Implementations a test registers (plug-ins) must not leak into later tests.

    The plug-in modules it imported go too, so that a later test importing the
    same file registers its implementations again (the worker imports each once).
    """
    import sys

    from topk_bench.attention import registry

    saved = dict(registry._REGISTRY)
    modules = set(sys.modules)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)
    for name in set(sys.modules) - modules:
        if name.startswith("topk_bench_plugin_"):
            del sys.modules[name]


@pytest.fixture
def single_thread():
    """Tiny tensors: on a loaded 2-core machine, OpenMP thread synchronisation costs up to 30x the work."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def cli(monkeypatch, capsys):
    """``topk-bench`` called in this process with the scripted executor (tests/faults.py): exit code and streams
    as a user sees them, every case measured in milliseconds."""
    from faults import Cli

    return Cli(monkeypatch, capsys)


@pytest.fixture
def measured(tmp_path, cli):
    """A results directory written by `run` of the tiny suite (3 ok cases, the scripted executor): (suite, out,
    csv)."""
    from faults import tiny_suite

    suite = tiny_suite(tmp_path, sizes=(16, 32, 64))
    out = tmp_path / "out"
    assert cli("run", suite, "--out", out, "-q").code == 0
    return suite, out, out / "tiny.csv"


@pytest.fixture
def measured_csv(measured):
    """The results CSV of :func:`measured`."""
    return measured[2]
