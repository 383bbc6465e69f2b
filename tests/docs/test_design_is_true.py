"""docs/DESIGN.md is true to the tree: its layouts name every package folder of topk_bench/ (and no folder that
is gone), and its implementations table every registered built-in."""

from __future__ import annotations

import re

from locations import ROOT

DESIGN = (ROOT / "docs" / "DESIGN.md").read_text()


BLOCKS = re.findall(r"```\n(.*?)```", DESIGN, flags=re.S)


def layout_folders() -> set[str]:
    """The folders the layout blocks list, each as a line's first word ending in ``/``."""
    return {m.group(1) for block in BLOCKS for m in re.finditer(r"^\s*([\w.]+)/(?:\s|$)", block, flags=re.M)}


def named_folders() -> set[str]:
    """Every ``name/`` the layout blocks name, in a line's first word or inline (``pretrained/ (model, ...)``)."""
    return {m.group(1) for block in BLOCKS for m in re.finditer(r"(?<![\w/])([\w.]+)/(?=[\s,)]|$)", block)}


def package_folders() -> set[str]:
    return {p.parent.name for p in (ROOT / "topk_bench").rglob("__init__.py") if "__pycache__" not in p.parts}


def test_every_package_folder_is_in_the_layout():
    assert package_folders() - named_folders() == set()


def test_every_folder_the_layout_names_exists():
    present = {p.name for p in ROOT.rglob("*") if p.is_dir() and ".venv" not in p.parts and ".git" not in p.parts}
    assert layout_folders() - present == set()


def test_every_registered_built_in_is_in_the_implementations_table():
    from topk_bench import attention

    table = DESIGN.split("## Implementations", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"^\| ([^|]+) \|", table, flags=re.M))
    listed = {n for cell in named for n in re.findall(r"`(\w+)`", cell)}
    built_in = {s.name for s in attention.all_specs() if s.fn.__module__.startswith("topk_bench.attention.")}
    assert built_in - listed == set()
