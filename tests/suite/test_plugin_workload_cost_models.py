"""A plug-in workload's broken cost model is bad input before any file is written."""

from __future__ import annotations

import pytest

from faults import tiny_suite

# --- a plug-in workload's cost model -------------------------------------------------------------------

TRAFFIC_PLUGIN = """
import math
from topk_bench import workloads

def traffic(case):
    {body}

workloads.register(workloads.WorkloadSpec(
    name="{name}", description="a cost model under test", build=lambda case, device, dtype: None,
    params={{"seq_len": 16, "d_model": 16, "heads": 2, "batch": 1}}, traffic=traffic))
"""


@pytest.mark.parametrize(
    "body,words",
    [
        ("return workloads.Traffic(flops=math.nan, bytes=1, tokens=1, tokens_per_sequence=1)", "flops"),
        ("return workloads.Traffic(flops=1, bytes=1, tokens=1, tokens_per_sequence=0)", "tokens_per_sequence"),
        ("return 'lots'", "Traffic"),
        ("raise ZeroDivisionError('oops')", "ZeroDivisionError: oops"),
    ],
)
def test_a_plugin_workloads_broken_cost_model_is_bad_input_before_any_file(tmp_path, cli, body, words, monkeypatch):
    """NaN traffic wrote rows the reader rejects (resume re-ran them forever); a raising one was a traceback."""
    from topk_bench.workloads import spec

    monkeypatch.setattr(spec, "_REGISTRY", dict(spec._REGISTRY))  # the plug-in's workload goes with the test
    name = f"costly_{abs(hash(body)) % 10**6}"
    (tmp_path / "costly.py").write_text(TRAFFIC_PLUGIN.format(body=body, name=name))
    suite = tiny_suite(tmp_path, extra=f'plugins = ["costly.py"]\nworkload = "{name}"').read_text()
    suite = suite.replace('workload = "mha"\n', "", 1)
    (tmp_path / "tiny.toml").write_text(suite)
    result = cli("run", tmp_path / "tiny.toml", "--out", tmp_path / "out")
    line = result.error_line
    assert result.code == 2 and "tiny.toml: workload: " in line and "traffic" in line and words in line, line
    assert not (tmp_path / "out").exists()
