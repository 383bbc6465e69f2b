"""Deprecated: topk-bench's attention implementations are ``topk_bench.attention`` (methods/, shared/, kernels/).

This package keeps the old import path working for one release, with a FutureWarning: ``import implementations``
gives the new package's names, and ``from implementations.masking import ...`` the module of its new place,
imported when first asked for (an import hook).
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

warnings.warn(
    "the package 'implementations' is now 'topk_bench.attention' (from topk_bench import attention; "
    "from topk_bench.attention import register, Implementation); the old name goes in the next release",
    FutureWarning,
    stacklevel=2,
)

# Old module -> its new place.
MOVED = {
    "implementations.native": "topk_bench.attention.kernels.native",
    "implementations.native.build": "topk_bench.attention.kernels.native.build",
    "implementations.triton_kernels": "topk_bench.attention.kernels.triton",
    "implementations.triton_kernels.decode": "topk_bench.attention.kernels.triton.decode",
    "implementations.triton_kernels.decode_kernels": "topk_bench.attention.kernels.triton.decode_kernels",
    "implementations.triton_kernels.defaults": "topk_bench.attention.kernels.triton.defaults",
    "implementations.triton_kernels.launch": "topk_bench.attention.kernels.triton.launch",
    "implementations.triton_kernels.online_softmax": "topk_bench.attention.kernels.triton.online_softmax",
    "implementations.triton_kernels.rounding": "topk_bench.attention.kernels.triton.rounding",
    "implementations.triton_kernels.kernels": "topk_bench.attention.kernels.triton.training_kernels",
    "implementations.layers": "topk_bench.attention.layers",
    "implementations.block_topk": "topk_bench.attention.methods.block_topk",
    "implementations.dsa": "topk_bench.attention.methods.dsa",
    "implementations.flex": "topk_bench.attention.methods.flex",
    "implementations.nsa": "topk_bench.attention.methods.nsa",
    "implementations.page_topk": "topk_bench.attention.methods.page_topk",
    "implementations.paper": "topk_bench.attention.methods.paper",
    "implementations.performer": "topk_bench.attention.methods.performer",
    "implementations.qchunk": "topk_bench.attention.methods.qchunk",
    "implementations.sdpa": "topk_bench.attention.methods.sdpa",
    "implementations.sink_window": "topk_bench.attention.methods.sink_window",
    "implementations.topk": "topk_bench.attention.methods.topk",
    "implementations.topk_fast": "topk_bench.attention.methods.topk_fast",
    "implementations.topk_sparse": "topk_bench.attention.methods.topk_sparse",
    "implementations.vanilla": "topk_bench.attention.methods.vanilla",
    "implementations.provenance": "topk_bench.attention.provenance",
    "implementations.registry": "topk_bench.attention.registry",
    "implementations.block_attention": "topk_bench.attention.shared.block_attention",
    "implementations.causal_product": "topk_bench.attention.shared.causal_product",
    "implementations.cuda_torch": "topk_bench.attention.shared.cuda_torch",
    "implementations.decode": "topk_bench.attention.shared.decode",
    "implementations.hardware": "topk_bench.attention.shared.hardware",
    "implementations.masking": "topk_bench.attention.shared.masking",
    "implementations.selection": "topk_bench.attention.shared.selection",
    "implementations.stages": "topk_bench.attention.shared.stages",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``implementations.X`` as the module of its new place (the same module object)."""

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED else None

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module):
        pass


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())

from topk_bench.attention import *  # noqa: E402,F403 -- the old package's names

__all__ = list(sys.modules["topk_bench.attention"].__all__)


def __getattr__(name):
    """``implementations.masking`` as an attribute: the moved module."""
    if f"{__name__}.{name}" in MOVED:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
