"""Every departure of dsa and nsa from their papers that a module doc marks (``[NSA-D3]``) is a row of
docs/sparse.md's table, with its reason, and the table lists no id that no module doc marks."""

from __future__ import annotations

import importlib
import re

from locations import ROOT

MODULES = {"NSA": "topk_bench.attention.methods.nsa", "DSA": "topk_bench.attention.methods.dsa"}
SPARSE = ROOT / "docs" / "sparse.md"
MARK = re.compile(r"\[((?:NSA|DSA)-D\d+)\]")
ROW = re.compile(r"^\| ((?:NSA|DSA)-D\d+) \|(.*)\|\s*$", re.M)


def marked() -> dict[str, set[str]]:
    """The ids each module doc marks, by method."""
    return {method: set(MARK.findall(importlib.import_module(name).__doc__ or "")) for method, name in MODULES.items()}


def table(text: str) -> dict[str, list[str]]:
    """The table's rows: id -> its cells (the paper, here, why)."""
    return {row_id: [cell.strip() for cell in cells.split("|")] for row_id, cells in ROW.findall(text)}


def disagreements(ids: dict[str, set[str]], rows: dict[str, list[str]]) -> list[str]:
    problems = [f"{i}: marked in {MODULES[i[:3]]}, not in docs/sparse.md" for s in ids.values() for i in s - set(rows)]
    problems += [f"{i}: in docs/sparse.md, marked in no module doc" for i in set(rows) - set().union(*ids.values())]
    problems += [f"{i}: a row without the paper's, this, and why" for i, c in rows.items() if len(c) != 3 or "" in c]
    for method, found in ids.items():
        numbers = sorted(int(i.split("-D")[1]) for i in found)
        if numbers != list(range(1, len(numbers) + 1)):
            problems.append(f"{method}: ids {numbers} are not 1 to {len(numbers)}")
    return sorted(problems)


def test_every_marked_deviation_is_a_row_of_docs_sparse_with_its_reason():
    ids, rows = marked(), table(SPARSE.read_text())
    assert ids["NSA"] and ids["DSA"]
    assert disagreements(ids, rows) == []


def test_the_check_names_a_deviation_missing_from_the_table_and_one_no_module_marks():
    ids, text = marked(), SPARSE.read_text()
    without = re.sub(r"^\| NSA-D2 \|.*\n", "", text, flags=re.M)
    assert disagreements(ids, table(without)) == [
        "NSA-D2: marked in topk_bench.attention.methods.nsa, not in docs/sparse.md"
    ]
    stale = text + "| DSA-D99 | a | b | c |\n"
    assert disagreements(ids, table(stale)) == ["DSA-D99: in docs/sparse.md, marked in no module doc"]
    no_reason = re.sub(r"^(\| DSA-D1 \|.*\|)[^|]*\|\s*$", r"\1 |", text, flags=re.M)
    assert disagreements(ids, table(no_reason)) == ["DSA-D1: a row without the paper's, this, and why"]
