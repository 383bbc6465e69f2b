import os

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

    from implementations import registry

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
