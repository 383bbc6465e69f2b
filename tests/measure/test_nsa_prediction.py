"""NSA's predicted peak equals its measured one on a BERT-base layer (causal, forward + backward), float32 and
bfloat16, per stage too: --predict sizes it at any length (docs/predicting.md)."""

import pytest

from topk_bench.case import Case
from topk_bench.child.execute import execute
from topk_bench.results import columns as col

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread")]

# The paper's blocks and stride; fewer selected blocks and a shorter window than its defaults, so that the
# measured side (the selection's sampled products, slow in bfloat16 on a CPU without bf16 kernels) stays short.
OPTIONS = {"select_blocks": 4, "window": 128}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_nsa_predicted_peak_equals_measured_at_1k(dtype):
    def case(**fields):
        return Case.make(
            suite="test",
            workload="mha",
            impl="nsa",
            params={"seq_len": 1024},
            options=OPTIONS,
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
