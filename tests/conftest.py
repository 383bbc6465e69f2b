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
    """Implementations a test registers (plug-ins) must not leak into later tests."""
    from implementations import registry

    saved = dict(registry._REGISTRY)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)
