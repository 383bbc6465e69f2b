"""A fixed corpus of real English text shipped with the repository, for the pretrained workload.

Two sources, one sentence per line: sentences of the top-k attention paper's
abstract, introduction and method sections (``paper.txt``, LaTeX removed) and
the prose of the all-MiniLM-L6-v2 model card (``model_card.txt``). Two topics
give nearest-neighbour retrieval some structure to agree or disagree on.
"""

from __future__ import annotations

from importlib import resources

SOURCES = ("paper.txt", "model_card.txt")


def _lines(name: str) -> list[str]:
    text = resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def load_corpus(sentences_per_text: int = 1) -> list[str]:
    """The corpus as a list of texts, each ``sentences_per_text`` consecutive sentences of one source.

    Grouping sentences gives longer inputs (more tokens than small k), so that
    top-k actually drops keys; a text never spans two sources.
    """
    if sentences_per_text < 1:
        raise ValueError(f"sentences_per_text must be >= 1, got {sentences_per_text}")
    texts: list[str] = []
    for name in SOURCES:
        lines = _lines(name)
        for start in range(0, len(lines), sentences_per_text):
            texts.append(" ".join(lines[start : start + sentences_per_text]))
    return texts
