"""A test-only plug-in whose name and description hold rich markup (``[/]``, ``[link]``) and a control
character: ``list`` and ``doctor`` show them as text."""

from __future__ import annotations

from topk_bench import attention
from topk_bench.attention import Implementation


def same(q, k, v, *, causal=False, activation="softmax"):
    return q.clone()


_IMPL = Implementation("test_markup[/]", same, "[/] closing tag, [link]here[/link] and \x1b[31m red")
if _IMPL.name not in attention.names():
    attention.register(_IMPL)
