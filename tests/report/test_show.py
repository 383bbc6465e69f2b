"""``topk-bench show``: pivot tables of the real writer's CSV that fit the width; the flat list with --wide."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from locations import ROOT, TESTS
from runner_fakes import FakeRun
from topk_bench import load_results
from topk_bench.errors import BadInput
from topk_bench.report.show import short_bytes, short_seconds, show
from topk_bench.run import runner
from topk_bench.run.executors import LocalExecutor
from topk_bench.run.resolve import Flags

MHA = ROOT / "suites" / "mha.toml"
LABELS = ("Vanilla", "Performer", "Q-chunking", "Top-k", "PyTorch SDPA")  # legends wrap in the row header


def _mha_results(out: Path, predict: bool) -> Path:
    """suites/mha.toml through the runner and its writer; vanilla times out from 4K (its larger sizes skipped)."""
    fake = FakeRun(lambda c: "timeout" if c.impl == "vanilla" and c.param_dict["seq_len"] >= 4096 else "ok")
    runner.run(MHA, Flags(out=out, device="cpu", predict=predict), progress=False, executor_obj=LocalExecutor(run=fake))
    return out / "mha.csv"


def _shown(path: Path, **kwargs) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    show(
        path,
        console=Console(file=out, width=kwargs.get("width") or 100),
        warnings=Console(file=err, width=300),
        **kwargs,
    )
    return out.getvalue(), err.getvalue()


@pytest.mark.parametrize("predict", [False, True])
def test_the_mha_suite_fits_100_columns_as_pivot_tables(tmp_path, predict):
    text, _ = _shown(_mha_results(tmp_path / "out", predict), width=100)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    for label in LABELS:
        assert label in text
    for size in (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536):  # every swept size is a column somewhere
        assert any(line.split()[1:] and str(size) in line.split() for line in lines), size
    assert "timeout" in text and "skipped" in text
    # one row per implementation and table: 40 cases are not 40 rows
    assert sum(line.strip().startswith("Vanilla") for line in lines) == text.count("mha · cpu")


def test_a_cell_is_median_time_over_peak_and_contended_times_are_marked(tmp_path):
    csv = _mha_results(tmp_path / "out", predict=False)
    text, err = _shown(csv, width=100)
    assert "8.19s*" in text and "3.91MiB" in text  # FakeRun at 4096: median 2 ms x 4096, peak 1000 B x 4096
    assert short_seconds(0.0081920) == "8.19ms" and short_bytes(4096 * 1000) == "3.91MiB"
    frame = load_results(csv)
    # FakeRun's samples (1, 2, 3) x seq_len spread 50%: every measured ok row is flagged noisy.
    assert set(frame.loc[frame["status"] == "ok", "trust"]) == {"noisy"}
    assert "*" in text and err.count("warning:") == 1 and "noisy samples" in err and "(marked *)" in err


def test_an_inference_suite_is_one_table_per_model_its_shape_said_once(tmp_path):
    """suites/decode.toml (3 models, batch 1 and 8): a table per model whose title gives the model's heads once,
    rows per implementation and batch; no row repeats q_heads, kv_heads or head_dim, no table mixes models."""
    decode = ROOT / "suites" / "decode.toml"
    runner.run(
        decode,
        Flags(out=tmp_path / "out", device="cpu"),
        progress=False,
        executor_obj=LocalExecutor(run=FakeRun(lambda c: "ok")),
    )
    text, _ = _shown(tmp_path / "out", width=100)
    # (a table too wide for 100 columns goes on below itself, under the same title)
    titles = list(dict.fromkeys(line.strip() for line in text.splitlines() if line.startswith("decode · cpu")))
    assert titles == [
        "decode · cpu · measured · model llama-3-8b: q_heads 32, kv_heads 8, head_dim 128",
        "decode · cpu · measured · model gemma-2b: q_heads 8, kv_heads 1, head_dim 256",
        "decode · cpu · measured · model bert-base: q_heads 12, kv_heads 12, head_dim 64",
    ]
    assert not re.search(r"q_heads=|kv_heads=|head_dim=|model=", text)
    first = text.split(titles[1])[0]  # the llama-3-8b tables
    assert first.count("PyTorch SDPA batch=1") == first.count("PyTorch SDPA batch=8") == first.count(" kv_len  ") >= 1
    assert max(len(line) for line in text.splitlines()) <= 100


def test_a_folder_of_results_folders_is_shown_folder_by_folder(tmp_path):
    """`show results/` after `make demo` (which wrote results/demo/): each sub-folder under its name."""
    _mha_results(tmp_path / "results" / "demo", predict=True)
    _mha_results(tmp_path / "results" / "more" / "cpu", predict=False)
    text, err = _shown(tmp_path / "results", width=100)
    assert text.index(f"{tmp_path / 'results' / 'demo'}:") < text.index(f"{tmp_path / 'results' / 'more' / 'cpu'}:")
    assert text.count("mha · cpu · predicted") >= 1 and text.count("mha · cpu · measured") >= 1
    assert err.count("warning:") == 1  # one line about the flagged times of both folders
    empty = tmp_path / "empty" / "sub"
    empty.mkdir(parents=True)
    with pytest.raises(BadInput, match="no results CSV"):
        _shown(tmp_path / "empty")


def test_wide_is_the_flat_list_with_the_trust_column(tmp_path):
    text, _ = _shown(_mha_results(tmp_path / "out", predict=False), wide=True, width=240)
    assert "mha (40 rows)" in text and "trust" in text and "peak GiB" in text


@pytest.mark.slow
def test_every_help_names_its_arguments_plainly():
    for command in ("run", "show", "plot", "compare", "list", "doctor"):
        text = subprocess.run(
            [sys.executable, "-m", "topk_bench", command, "--help"],
            capture_output=True,
            text=True,
            env={"COLUMNS": "100", "PATH": ""},
        ).stdout
        usage = text.splitlines()[0]
        assert "{" not in usage and not re.search(r"<(bool|path|str|int|float|list\[\w+\])>", text), text


@pytest.mark.slow
def test_list_fits_the_width_and_shows_a_plug_ins_implementations():
    plugin = TESTS / "plugins" / "failing_impls.py"
    result = subprocess.run(
        [sys.executable, "-m", "topk_bench", "list", "--plugins", str(plugin)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert max(len(line) for line in result.stdout.splitlines()) <= 100
    import topk_bench.attention

    before = set(topk_bench.attention.names())
    from topk_bench import plugins

    plugins.load([str(plugin)])
    added = set(topk_bench.attention.names()) - before
    assert added and all(name in result.stdout for name in added)


def test_wide_shows_which_code_ran_where_a_row_says(tmp_path):
    import pandas as pd

    csv = _mha_results(tmp_path / "out", predict=False)
    text, _ = _shown(csv, wide=True, width=400)
    assert "code_path" not in text  # no row says: no column
    frame = pd.read_csv(csv, dtype=str, keep_default_na=False)
    frame.loc[frame["impl"] == "topk", "code_path"] = "decode_tiles=2MiB;half_products=native"
    frame.to_csv(csv, index=False)
    text, _ = _shown(csv, wide=True, width=400)
    assert "code_path" in text
    assert text.count("decode_tiles=2MiB;half_products=native") == (frame["impl"] == "topk").sum()
