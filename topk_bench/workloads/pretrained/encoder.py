"""The ``pretrained`` workload: encode the shipped corpus with all-MiniLM-L6-v2, some sublayers replaced.

A case's ``impl`` (with its options) replaces every self-attention layer; its
``ff_impl`` (with ``ff_options``), when set, replaces every feed-forward layer,
else the model keeps its own FF. ``vanilla`` at attention is the original model
up to float rounding (tested to 1e-5), so "top-k at FF only" is
``impl = "vanilla"``, ``ff_impl = "topk"``.

Parameters (``[shape]``/``[sweep]`` of a suite; all optional):

- ``sentences_per_text`` (default 2): consecutive corpus sentences per input
  text (longer texts: more tokens than small k, so top-k really drops keys);
- ``max_tokens`` (default 512, the model's limit): truncation;
- ``ff_activation`` (``"gelu"``, default, or ``"relu"``): see :mod:`.feedforward`;
- ``max_texts`` (default 0: all): the first texts of the corpus only (quick runs, tests);
- any option name of the implementations (``topk``, ``nb_features``,
  ``chunk_size``...): given to whichever of the attention and FF
  implementations has that option, so one ``[sweep] topk = [...]`` sweeps k
  at attention for one entry and at FF for another.

Inference only (``mode = "fwd"``): zero-shot, as the paper's §4.4; measured
only (the real weights cannot be sized under ``FakeTensorMode``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch
from torch import nn

import topk_bench.attention
from topk_bench.case import Case
from topk_bench.errors import Unsupported
from topk_bench.types import Mode
from topk_bench.workloads.pretrained import model as pretrained
from topk_bench.workloads.pretrained.corpus import load_corpus
from topk_bench.workloads.pretrained.feedforward import UnsupportedAtFeedForward
from topk_bench.workloads.spec import Workload

PARAMS = {"sentences_per_text": 2, "max_tokens": pretrained.MAX_TOKENS, "ff_activation": "gelu", "max_texts": 0}


def settings(case: Case) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(workload parameters, attention options, FF options) of a case; params that are options go to the options."""
    params = case.param_dict
    known = {name: params.get(name, default) for name, default in PARAMS.items()}
    attention = dict(case.option_dict)
    ff = dict(case.ff_option_dict)
    for name, value in params.items():
        if name in PARAMS:
            continue
        # An option neither implementation has leaves it unchanged (Performer's line across k).
        for impl, options in ((case.impl, attention), (case.ff_impl, ff)):
            if impl is not None and name in topk_bench.attention.spec(impl).options:
                options[name] = value
    return known, attention, ff


@lru_cache(maxsize=4)
def corpus_ids(sentences_per_text: int, max_tokens: int, max_texts: int = 0) -> tuple[torch.Tensor, ...]:
    tokenizer, _ = pretrained.load_model()
    texts = load_corpus(sentences_per_text)
    return tuple(pretrained.tokenize(tokenizer, texts[: max_texts or len(texts)], max_tokens))


def corpus_key(params: dict[str, Any]) -> tuple[int, int, int]:
    """The arguments of :func:`corpus_ids` from a case's workload parameters."""
    return int(params["sentences_per_text"]), int(params["max_tokens"]), int(params["max_texts"])


class CorpusEncoder(nn.Module):
    """``model(*token_ids) -> [N, 384]`` unit sentence embeddings; a workload's model."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, *token_ids: torch.Tensor) -> torch.Tensor:
        return pretrained.encode(self.encoder, token_ids)


def plugged(case: Case) -> CorpusEncoder:
    """The case's model: the pretrained weights with its implementations plugged in (seeded: Performer's features)."""
    if case.predicted:
        raise Unsupported("the pretrained workload is measured only (real weights cannot be faked)")
    if case.mode is not Mode.FWD:
        raise Unsupported('the pretrained workload is zero-shot inference: use mode = "fwd"')
    params, attention, ff = settings(case)
    _, bert = pretrained.load_model()
    torch.manual_seed(case.seed)
    try:
        model = pretrained.PluggedBert(
            bert, case.impl, attention, case.ff_impl, ff, ff_activation=params["ff_activation"]
        )
    except UnsupportedAtFeedForward as exc:
        raise Unsupported(str(exc)) from None
    return CorpusEncoder(model)


def build(case: Case, device: torch.device, dtype: torch.dtype) -> Workload:
    if dtype != torch.float32 or device.type != "cpu":
        raise Unsupported("the pretrained workload runs in float32 on the CPU (the model's weights)")
    params, _, _ = settings(case)
    return Workload(plugged(case), corpus_ids(*corpus_key(params)))
