"""DSA's predicted peak equals its measured one on a BERT-base layer (causal, forward + backward), float32 and
bfloat16, per stage too: --predict sizes it at any length (docs/predicting.md)."""

import pytest

from topk_bench.case import Case
from topk_bench.child.execute import execute
from topk_bench.results import columns as col

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread")]

# The reduced default for BERT-base layers (topk_bench.attention.methods.dsa.BERT_BASE), 4 query chunks at 1K.
OPTIONS = {"index_heads": 4, "index_head_dim": 32, "topk": 128, "chunk_size": 256}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dsa_predicted_peak_equals_measured_at_1k(dtype):
    def case(**fields):
        return Case.make(
            suite="test",
            workload="mha",
            impl="dsa",
            params={"seq_len": 1024},
            options={**OPTIONS, "indexer_loss": 1.0},
            causal=True,
            dtype=dtype,
            warmup=0,
            repeats=1,
            **fields,
        )

    measured, predicted = execute(case()), execute(case(method="predicted"))
    assert measured.status == predicted.status == "ok", (measured.error, predicted.error)
    assert predicted.peak_bytes == measured.peak_bytes
    assert predicted.baseline_bytes == measured.baseline_bytes
    assert predicted.extra[col.STAGE_PEAK_BYTES] == measured.extra[col.STAGE_PEAK_BYTES]
