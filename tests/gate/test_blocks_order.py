"""The order of a look's blocks (topk_bench/gate/blocks.py): two rounds each, as many a side, in quartets that
turn about, so that neither side keeps the start or the end of a look."""

from __future__ import annotations

import pytest

from topk_bench.gate.blocks import BASE, NEW, order


@pytest.mark.parametrize("rounds", [4, 6, 8, 16])
def test_each_side_gets_its_rounds_in_blocks_of_two(rounds):
    blocks = order(rounds)
    assert all(count == 2 for _, count in blocks)
    assert sum(c for s, c in blocks if s == BASE) == sum(c for s, c in blocks if s == NEW) == rounds


def test_quartets_turn_about():
    sides = "".join("B" if s == BASE else "N" for s, _ in order(16))
    assert sides == "BNNBNBBNBNNBNBBN"
