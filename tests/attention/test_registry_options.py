"""An entry's options are its function's: ``register()`` refuses options that its functions' signatures contradict
(an option the function does not take, a default it declares otherwise), so that the registry's table cannot drift
from the code, and an entry may take its defaults from its function's signature, written once."""

from __future__ import annotations

import pytest

from topk_bench import attention
from topk_bench.attention import Implementation, registry


def attend(q, k, v, *, causal=False, activation="softmax", topk=8, chunk_size=64, hook=None):
    return q


def select(q, k, *, causal=False, topk=4, **_ignored):
    return q


def test_every_registered_implementation_agrees_with_its_signatures():
    for spec in attention.all_specs():
        assert registry.option_mismatches(spec) == [], spec.name


@pytest.mark.parametrize(
    "options, selection, message",
    [
        ({"topk": 16, "chunk_size": 64}, None, r"option 'topk' defaults to 16, attend's topk to 8"),
        ({"topk": 8, "window": 4}, None, r"option 'window' is no parameter of attend"),
        ({"topk": 8, "chunk_size": 64}, select, r"option 'topk' defaults to 8, select's topk to 4"),
    ],
)
def test_register_refuses_options_its_functions_contradict(options, selection, message):
    entry = Implementation("test_drifted", attend, "options against the signature", options=options)
    if selection is not None:
        entry = Implementation("test_drifted", attend, "d", options=options, selection=selection)
    with pytest.raises(ValueError, match=r"^implementation 'test_drifted': " + message):
        attention.register(entry)
    assert "test_drifted" not in attention.names()


def test_an_entry_may_take_its_options_from_its_functions_signature():
    assert dict(registry.signature_options(attend, exclude=("hook",))) == {"topk": 8, "chunk_size": 64}
    dsa, nsa = attention.spec("dsa"), attention.spec("nsa")
    assert list(dsa.options) == [
        "index_heads", "index_head_dim", "topk", "chunk_size", "indexer_loss", "seed", "indexer", "index_keys"
    ]  # fmt: skip
    assert (dsa.options["index_heads"], dsa.options["index_head_dim"], dsa.options["topk"]) == (64, 128, 2048)
    assert {k: nsa.options[k] for k in ("compress_block", "compress_stride", "select_block", "window")} == {
        "compress_block": 32, "compress_stride": 16, "select_block": 64, "window": 512
    }  # fmt: skip
