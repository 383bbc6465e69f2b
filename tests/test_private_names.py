"""No module of topk_bench/ or topk_bench/attention/ reaches into another's private names (``from m import _x``,
``m._x``): what modules share is public, so that a reader sees what a module offers by its names alone."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("topk_bench", "implementations")  # implementations/: the old name's shim


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module an ``ImportFrom`` names, relative imports resolved against ``module``."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def private_uses(source_text: str, module: str, is_package: bool = False) -> list[str]:
    """``line: what`` for each private name of another of our modules that ``module``'s source imports or reads."""
    tree = ast.parse(source_text)
    found, modules = [], {}  # local name -> the module of ours it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _absolute(node, module, is_package)
            if source.split(".")[0] not in PACKAGES:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and source != module:
                    found.append(f"{node.lineno}: from {source} import {alias.name}")
                if _is_module(f"{source}.{alias.name}"):
                    modules[alias.asname or alias.name] = f"{source}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    first = alias.name.split(".")[0]  # a plain `import a.b` binds `a`, the package a
                    modules[alias.asname or first] = alias.name if alias.asname else first
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        chain, value = [], node.value
        while isinstance(value, ast.Attribute):
            chain.insert(0, value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in modules:
            owner = ".".join([modules[value.id], *chain])
            if _is_module(owner) and owner != module:
                found.append(f"{node.lineno}: {owner}.{node.attr}")
    return sorted(found, key=lambda line: (int(line.split(":")[0]), line))


SOURCES = sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_uses_another_modules_private_names(path):
    assert private_uses(path.read_text(), _module_name(path), path.name == "__init__.py") == []


def test_the_walk_finds_each_way_of_reaching_a_private_name():
    """The check itself: an import of a private name (absolute or relative), and a private attribute of an imported
    module (by any import) are found; a module's own private names and a private attribute of an object are not."""
    source = (
        "from topk_bench.attention.shared.block_attention import _dots\n"
        "from ..kernels.triton import _cdiv, launch\n"
        "from ..shared import masking\n"
        "import topk_bench.attention.registry as registry\n"
        "import topk_bench.attention\n"
        "from topk_bench.attention.methods.probe import _mine\n"
        "x = masking._private + registry._REGISTRY + launch.cdiv(1, 2) + _mine + object()._hidden\n"
        "y = topk_bench.attention.kernels.triton._why_not\n"
    )
    assert private_uses(source, "topk_bench.attention.methods.probe") == [
        "1: from topk_bench.attention.shared.block_attention import _dots",
        "2: from topk_bench.attention.kernels.triton import _cdiv",
        "7: topk_bench.attention.registry._REGISTRY",
        "7: topk_bench.attention.shared.masking._private",
        "8: topk_bench.attention.kernels.triton._why_not",
    ]
