"""Every malformed suite (or bench.toml, or flag): exit code 2, one line naming file and key, nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from locations import TESTS
from topk_bench.cli import main

PLUGINS = TESTS / "plugins"

GOOD = """
name = "bad"
workload = "mha"
causal = true
[shape]
d_model = 8
heads = 2
[sweep]
seq_len = [16, 32]
[[impl]]
name = "topk"
topk = 4
chunk_size = 8
[plot]
x = "seq_len"
"""

# (what is wrong, how the good suite is edited, the key named, words of the message)
CASES = [
    (
        "unknown top-level key",
        lambda s: s.replace('name = "bad"', 'name = "bad"\nrepeat = 3'),
        "repeat",
        "unknown key; did you mean 'repeats'? (expected one of:",
    ),
    ("unknown key in [plot]", lambda s: s + 'colour = "red"\n', "plot.colour", "unknown key"),
    ("wrong type of a size", lambda s: s.replace("[16, 32]", '["16", 32]'), "sweep.seq_len[0]", "valid integer"),
    ("wrong type of a flag", lambda s: s.replace("causal = true", 'causal = "yes"'), "causal", "valid boolean"),
    ("wrong type of an option", lambda s: s.replace("topk = 4", 'topk = "4"'), "impl[0] (topk).topk", "integer"),
    (
        "zero size in [shape]",
        lambda s: s.replace("heads = 2", "heads = 2\nbatch = 0"),
        "shape.batch",
        "positive integer",
    ),
    ("negative swept size", lambda s: s.replace("[16, 32]", "[16, -32]"), "sweep.seq_len", "positive integer"),
    ("topk < 1", lambda s: s.replace("topk = 4", "topk = 0"), "impl[0] (topk).topk", ">= 1"),
    ("chunk_size < 1", lambda s: s.replace("chunk_size = 8", "chunk_size = 0"), "impl[0] (topk).chunk_size", ">= 1"),
    (
        "unknown implementation",
        lambda s: s.replace('name = "topk"', 'name = "toppk"'),
        "impl[0] (toppk).name",
        "unknown implementation 'toppk'",
    ),
    ("unknown option", lambda s: s.replace("topk = 4", "topk = 4\nk = 4"), "impl[0] (topk).k", "has no option 'k'"),
    (
        "activation not supported",
        lambda s: s.replace('name = "topk"\ntopk = 4\nchunk_size = 8', 'name = "sdpa"').replace(
            "causal = true", 'activation = "relu"'
        ),
        "impl[0] (sdpa)",
        "does not support activation 'relu'",
    ),
    (
        "causal masking not supported",
        lambda s: (
            'plugins = ["noncausal_attention.py"]\n'
            + s.replace('name = "topk"\ntopk = 4\nchunk_size = 8', 'name = "noncausal_test_impl"')
        ),
        "impl[0] (noncausal_test_impl)",
        "does not support causal masking",
    ),
    ("empty sweep list", lambda s: s.replace("[16, 32]", "[]"), "sweep.seq_len", "non-empty"),
    ("empty [sweep] table", lambda s: s.replace("seq_len = [16, 32]", ""), "sweep", "expected at least 1 entry"),
    ("no [[impl]]", lambda s: s[: s.index("[[impl]]")], "impl", "missing required key"),
    (
        "unknown workload",
        lambda s: s.replace('workload = "mha"', 'workload = "attention"'),
        "workload",
        "unknown workload 'attention'; add it with `plugins = [\"your.module\"]` (known: decode, decoder, ff, mha, "
        "prefill, pretrained)",
    ),
    (
        "unknown shape parameter",
        lambda s: s.replace("heads = 2", "heads = 2\nlength = 4"),
        "shape.length",
        "unknown shape parameter",
    ),
    (
        "swept key nobody has",
        lambda s: s.replace("seq_len = [16, 32]", "seq_len = [16]\nnb_features = [4]"),
        "sweep.nb_features",
        "nor an option of implementation 'topk'",
    ),
    ("heads do not divide d_model", lambda s: s.replace("heads = 2", "heads = 3"), "shape.heads", "divisible"),
    ("plot.x not a parameter", lambda s: s.replace('x = "seq_len"', 'x = "length"'), "plot.x", "suite parameter"),
    ("bad panel", lambda s: s + "panels = [[4096, 512]]\n", "plot.panels", "xmin < xmax"),
    (
        "feedforward outside the decoder",
        lambda s: s.replace("chunk_size = 8", 'chunk_size = 8\nfeedforward = "qchunk"'),
        "impl[0] (topk).feedforward",
        "has no feed-forward sublayer",
    ),
    ("causal feed-forward", lambda s: s.replace('workload = "mha"', 'workload = "ff"'), "causal", "no mask"),
    ("missing plug-in", lambda s: 'plugins = ["no_such_plugin_module_xyz"]\n' + s, "plugins", "cannot import"),
    (
        "unknown protocol",
        lambda s: s.replace('name = "bad"', 'name = "bad"\nprotocol = "authors"'),
        "protocol",
        "expected 'ours' or 'paper', got 'authors'",
    ),
    (
        "warm-up under the paper protocol",
        lambda s: s.replace('name = "bad"', 'name = "bad"\nprotocol = "paper"\nwarmup = 1'),
        "warmup",
        "protocol 'paper' fixes warmup = 0 (the first, cold iteration is timed), got 1",
    ),
    (
        "repeats under the paper protocol",
        lambda s: s.replace('name = "bad"', 'name = "bad"\nprotocol = "paper"\nrepeats = 5'),
        "repeats",
        "protocol 'paper' fixes repeats = 3",
    ),
    (
        "scale set under the paper protocol",
        lambda s: s.replace('name = "bad"', 'name = "bad"\nprotocol = "paper"').replace(
            'name = "topk"\ntopk = 4', 'name = "qchunk_paper"\nscale = 0.5'
        ),
        "impl[0] (qchunk_paper).scale",
        "protocol 'paper' sets the option 'scale' itself",
    ),
    (
        "a workload that does not follow the paper protocol",
        lambda s: (
            f'plugins = ["{PLUGINS}/cross_attention_workload.py"]\n'
            + s.replace('workload = "mha"', 'workload = "cross_attention"\nprotocol = "paper"').replace(
                "causal = true", "causal = false"
            )
        ),
        "protocol",
        "the cross_attention workload does not follow protocol 'paper' (workloads that do: decoder, ff, mha)",
    ),
    (
        "an unknown timer",
        lambda s: s.replace('name = "bad"', 'name = "bad"\ntimer = "wallclock"'),
        "timer",
        "'events', 'cudagraph', 'perf_counter' or 'process_time'",
    ),
    (
        "a flush that is no boolean",
        lambda s: s.replace('name = "bad"', 'name = "bad"\nflush_l2 = "yes"'),
        "flush_l2",
        "valid boolean",
    ),
    (
        "a negative warm-up time",
        lambda s: s.replace('name = "bad"', 'name = "bad"\nwarmup_s = -1'),
        "warmup_s",
        "greater than or equal to 0",
    ),
    (
        "a timer under the paper protocol",
        lambda s: s.replace('name = "bad"', 'name = "bad"\nprotocol = "paper"\ntimer = "cudagraph"').replace(
            'name = "topk"\ntopk = 4\nchunk_size = 8', 'name = "topk_paper"'
        ),
        "timer",
        "protocol 'paper' fixes timer = events (each eager iteration is timed as theirs was)",
    ),
    (
        "compile_mode without compile",
        lambda s: s.replace("chunk_size = 8", 'chunk_size = 8\ncompile_mode = "max-autotune"'),
        "impl[0] (topk).compile_mode",
        "compile_mode without compile = true",
    ),
    ("invalid TOML", lambda s: s.replace("[shape]", "[shape"), None, "invalid TOML"),
    ("unreadable file", lambda s: b"\xff\xfe\x00 not utf-8", None, "unreadable"),
]


@pytest.fixture
def noncausal_plugin(tmp_path):
    (tmp_path / "noncausal_attention.py").write_text(
        "from topk_bench import attention\n"
        "from topk_bench.attention import Implementation\n"
        "attention.register(Implementation(name='noncausal_test_impl', fn=attention.get('vanilla'),\n"
        "    description='no mask', causal=False))\n"
    )


def cli(capsys, *argv) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    return exit_info.value.code, capsys.readouterr().err


@pytest.mark.parametrize("what,edit,key,words", CASES, ids=[c[0] for c in CASES])
def test_malformed_suite_is_one_line_exit_2_and_writes_nothing(
    tmp_path, capsys, noncausal_plugin, what, edit, key, words
):
    suite = tmp_path / "bad.toml"
    text = edit(GOOD)
    suite.write_bytes(text if isinstance(text, bytes) else text.encode())
    out = tmp_path / "out"
    code, err = cli(capsys, "run", str(suite), "--out", str(out))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"topk-bench: error: {suite}: ")
    if key is not None:
        assert f"{suite}: {key}: " in lines[0]
    assert words in lines[0]
    assert not out.exists()


def test_the_good_suite_is_valid(tmp_path, noncausal_plugin):
    from topk_bench.suite.load import load_suite

    (tmp_path / "good.toml").write_text(GOOD)
    assert load_suite(tmp_path / "good.toml").impl[0].options == {"topk": 4, "chunk_size": 8}


def test_missing_suite_file(tmp_path, capsys):
    code, err = cli(capsys, "run", str(tmp_path / "nope.toml"), "--out", str(tmp_path / "out"))
    assert code == 2 and err.strip() == f"topk-bench: error: {tmp_path / 'nope.toml'}: file not found"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "text,key,words",
    [
        ("repeats = 0\n", "repeats", "greater than or equal to 1"),
        ("devise = 'cpu'\n", "devise", "unknown key"),
        ("[executor]\nkind = 'cloud'\n", "executor.kind", "'local' or 'slurm'"),
        ("max_memory_gib = 'lots'\n", "max_memory_gib", "valid number"),
    ],
)
def test_malformed_bench_toml(tmp_path, capsys, text, key, words):
    config = tmp_path / "bench.toml"
    config.write_text(text)
    suite = tmp_path / "good.toml"
    suite.write_text(GOOD)
    code, err = cli(capsys, "run", str(suite), "--config", str(config), "--out", str(tmp_path / "out"))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"{config}: {key}: " in err and words in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "flags,key",
    [
        (["--repeats", "0"], "--repeats"),
        (["--rounds", "0"], "--rounds"),
        (["--max-memory", "0"], "--max-memory"),
        (["--max-case-seconds", "-1"], "--max-case-seconds"),
        (["--jobs", "0"], "--jobs"),
        (["--device", "tpu"], "--device"),
        (["--executor", "cloud"], "--executor"),
        (["--timer", "wallclock"], "--timer"),
        (["--warmup-s", "-0.5"], "--warmup-s"),
    ],
)
def test_bad_flags(tmp_path, capsys, flags, key):
    suite = tmp_path / "good.toml"
    suite.write_text(GOOD)
    code, err = cli(capsys, "run", str(suite), "--out", str(tmp_path / "out"), *flags)
    assert code == 2 and len(err.strip().splitlines()) == 1 and f"error: {key}: " in err
    assert not (tmp_path / "out").exists()


def test_rounds_are_refused_under_the_paper_protocol(tmp_path, capsys):
    suite = tmp_path / "good.toml"
    suite.write_text(GOOD.replace('name = "bad"', 'name = "bad"\nprotocol = "paper"'))
    code, err = cli(capsys, "run", str(suite), "--out", str(tmp_path / "out"), "--rounds", "3")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "error: --rounds: protocol 'paper' fixes how each case is measured" in err
    suite.write_text(GOOD.replace('name = "bad"', 'name = "bad"\nprotocol = "paper"\nrounds = 2'))
    code, err = cli(capsys, "run", str(suite), "--out", str(tmp_path / "out"))
    assert code == 2 and f"{suite}: rounds: protocol 'paper'" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "flags", [["--warmup", "1"], ["--repeats", "10"], ["--timer", "cudagraph"], ["--flush-l2"], ["--warmup-s", "0.5"]]
)
def test_flags_the_paper_protocol_fixes(tmp_path, capsys, flags):
    suite = tmp_path / "good.toml"
    suite.write_text(GOOD.replace('name = "bad"', 'name = "bad"\nprotocol = "paper"'))
    code, err = cli(capsys, "run", str(suite), "--out", str(tmp_path / "out"), *flags)
    assert code == 2 and len(err.strip().splitlines()) == 1 and f"error: {flags[0]}: protocol 'paper' fixes" in err
    assert not (tmp_path / "out").exists()
    code, err = cli(
        capsys, "run", str(suite), "--out", str(tmp_path / "out"), "--warmup", "0", "--repeats", "3", "--predict", "-q"
    )  # the protocol's own values are fine
    assert code == 0, err


def test_cuda_requested_without_a_gpu(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    suite = tmp_path / "good.toml"
    suite.write_text(GOOD)
    code, err = cli(capsys, "run", str(suite), "--out", str(tmp_path / "out"), "--device", "cuda")
    assert code == 2 and "no CUDA device is available" in err


def test_slurm_executor_unavailable_is_bad_input(tmp_path, capsys, monkeypatch):
    import topk_bench.run.slurm

    monkeypatch.setitem(sys.modules, "topk_bench.run.slurm.executor", None)  # as if the module were absent
    monkeypatch.delattr(topk_bench.run.slurm, "executor", raising=False)  # (and never imported)
    suite = tmp_path / "good.toml"
    suite.write_text(GOOD)
    code, err = cli(capsys, "run", str(suite), "--out", str(tmp_path / "out"), "--executor", "slurm")
    assert code == 2 and "executor.kind: slurm executor not available" in err


@pytest.mark.slow
def test_a_real_process_prints_no_traceback(tmp_path):
    suite = tmp_path / "bad.toml"
    suite.write_text(GOOD.replace("topk = 4", "topk = 0"))
    result = subprocess.run(
        [sys.executable, "-m", "topk_bench", "run", str(suite), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"topk-bench: error: {suite}: impl[0] (topk).topk: expected an integer >= 1, got 0"
    ]
    assert not (tmp_path / "out").exists() and not list(Path(tmp_path).glob("results*"))


DECODE = """
name = "bad"
workload = "decode"
dtype = "bfloat16"
[shape]
new_tokens = 1
[sweep]
kv_len = [64, 128]
model = ["llama-3-8b", "bert-base"]
[cpu_max]
kv_len = 64
[[impl]]
name = "topk"
topk = 4
[plot]
x = "kv_len"
split = ["model"]
"""

# The inference workloads' keys: models, heads, modes, the CPU's limit, one figure per model.
INFERENCE_CASES = [
    (
        "unknown model",
        lambda s: s.replace('"bert-base"', '"bert-large"'),
        "sweep.model",
        "expected one of: llama-3-8b, gemma-2b, bert-base, custom, got 'bert-large'",
    ),
    (
        "model in [shape] is a name",
        lambda s: s.replace('model = ["llama-3-8b", "bert-base"]', "").replace(
            "new_tokens = 1", "new_tokens = 1\nmodel = 8"
        ),
        "shape.model",
        "expected one of:",
    ),
    (
        "heads given and set by the model",
        lambda s: s.replace("new_tokens = 1", "new_tokens = 1\nq_heads = 16"),
        "shape.q_heads",
        "also set by model = 'llama-3-8b' (to 32); to give it yourself, use model = 'custom'",
    ),
    (
        "kv_heads do not divide q_heads",
        lambda s: (
            s.replace('model = ["llama-3-8b", "bert-base"]', "")
            .replace("new_tokens = 1", "new_tokens = 1\nq_heads = 6\nkv_heads = 4")
            .replace('split = ["model"]', "")
        ),
        "shape.kv_heads",
        "expected kv_heads (4) to divide q_heads (6)",
    ),
    (
        "a decode step has no backward",
        lambda s: s.replace('dtype = "bfloat16"', 'dtype = "bfloat16"\nmode = "fwd_bwd"'),
        "mode",
        "a decode step is forward only",
    ),
    (
        "an entry's mode",
        lambda s: s.replace("topk = 4", 'topk = 4\nmode = "fwd_bwd"'),
        "impl[0] (topk)",
        "a decode step is forward only",
    ),
    (
        "names swept for an option",
        lambda s: s.replace("kv_len = [64, 128]", 'kv_len = [64, 128]\ntopk = ["a", "b"]').replace("topk = 4\n", ""),
        "sweep.topk",
        "implementation options are swept as sizes",
    ),
    (
        "names for a size",
        lambda s: s.replace("kv_len = [64, 128]", 'kv_len = ["64", "128"]'),
        "sweep.kv_len",
        "positive integer",
    ),
    (
        "cpu_max of a key not swept",
        lambda s: s.replace("kv_len = 64\n", "batch = 4\n"),
        "cpu_max.batch",
        "expected a swept size (one of: kv_len)",
    ),
    ("cpu_max of names", lambda s: s.replace("kv_len = 64\n", "model = 4\n"), "cpu_max.model", "a swept size"),
    (
        "plot.split not a parameter",
        lambda s: s.replace('split = ["model"]', 'split = ["colour"]'),
        "plot.split[0]",
        "expected a suite parameter other than the x axis",
    ),
    (
        "plot.split on the x axis",
        lambda s: s.replace('split = ["model"]', 'split = ["kv_len"]'),
        "plot.split[0]",
        "other than the x axis",
    ),
    (
        "quality and fidelity both",
        lambda s: s.replace('dtype = "bfloat16"', 'dtype = "bfloat16"\nquality = "random"\nfidelity = true'),
        "quality",
        "ask for one of them",
    ),
    (
        "unknown quality inputs",
        lambda s: s.replace('dtype = "bfloat16"', 'dtype = "bfloat16"\nquality = ["gpt2"]'),
        "quality[0]",
        "'random', 'minilm' or 'peaked'",
    ),
    (
        "prefill is causal",
        lambda s: (
            s.replace('workload = "decode"', 'workload = "prefill"\ncausal = false')
            .replace("kv_len", "seq_len")
            .replace("new_tokens = 1", "")
            .replace("[cpu_max]\nseq_len = 64\n", "")
        ),
        "causal",
        "prefill is causal attention",
    ),
]


@pytest.mark.parametrize("what,edit,key,words", INFERENCE_CASES, ids=[c[0] for c in INFERENCE_CASES])
def test_malformed_inference_suite_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, what, edit, key, words):
    suite = tmp_path / "bad.toml"
    suite.write_text(edit(DECODE))
    out = tmp_path / "out"
    code, err = cli(capsys, "run", str(suite), "--out", str(out), "--predict")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert f"{suite}: {key}: " in lines[0] and words in lines[0]
    assert not out.exists()


def test_the_good_inference_suite_is_valid(tmp_path):
    from topk_bench.suite.load import load_suite

    (tmp_path / "good.toml").write_text(DECODE)
    suite = load_suite(tmp_path / "good.toml")
    assert suite.mode == "fwd" and suite.causal  # the workload's


@pytest.mark.parametrize(
    "argv,words",
    [
        (
            ("--predict", "--device", "cuda", "--gpu", "sm75"),
            "--gpu: unknown GPU 'sm75' (known: h100-sxm, h100-pcie, h200, a100-40gb, a100-80gb, l4, b200)",
        ),
        (
            ("--predict", "--gpu", "sm80"),
            "--gpu: names the GPU a CUDA prediction models: give it with --predict --device cuda",
        ),
    ],
    ids=["unknown GPU", "GPU without a CUDA prediction"],
)
def test_a_bad_gpu_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, argv, words):
    suite = tmp_path / "good.toml"
    suite.write_text(GOOD)
    out = tmp_path / "out"
    code, err = cli(capsys, "run", str(suite), "--out", str(out), *argv)
    assert code == 2 and err.strip().splitlines() == [f"topk-bench: error: {words}"], err
    assert not out.exists()


def test_the_gpu_of_a_cuda_prediction_is_in_its_rows(tmp_path, capsys):
    """sm80 (the A100 80 GB's old name) models an A100: its rows say so and get their own case ids; sm90 and
    h100-sxm (the default) keep the ids of a prediction that names none. Every row has its kernel launches (fewer
    than its ops: views launch none) and its predicted time."""
    import csv

    suite = tmp_path / "good.toml"
    suite.write_text(GOOD)
    rows = {}
    for gpu in ("sm80", "sm90", "h100-sxm", None):
        out = tmp_path / f"out-{gpu}"
        code, err = cli(
            capsys,
            "run",
            str(suite),
            "--out",
            str(out),
            "--predict",
            "--device",
            "cuda",
            "-q",
            *(("--gpu", gpu) if gpu else ()),
        )
        assert code == 0, err
        rows[gpu] = list(csv.DictReader(open(out / "bad.csv", newline="")))
    assert [r["case_id"] for r in rows["sm90"]] == [r["case_id"] for r in rows[None]]
    assert [r["case_id"] for r in rows["h100-sxm"]] == [r["case_id"] for r in rows[None]]
    assert not {r["case_id"] for r in rows["sm80"]} & {r["case_id"] for r in rows["sm90"]}
    assert {r["device_name"] for r in rows["sm80"]} == {"NVIDIA A100-SXM4-80GB (a100-80gb, sm80, predicted)"}
    assert {r["device_name"] for r in rows["sm90"]} == {"NVIDIA H100 80GB HBM3 (h100-sxm, sm90, predicted)"}
    for a100, h100 in zip(rows["sm80"], rows["sm90"]):  # the same kernels, a slower part
        assert 0 < int(h100["kernel_launches"]) < int(h100["ops_per_iter"])
        assert a100["kernel_launches"] == h100["kernel_launches"]
        assert float(a100["device_time_predicted_s"]) > float(h100["device_time_predicted_s"]) > 0
        assert float(h100["time_predicted_s"]) >= float(h100["device_time_predicted_s"])
        assert h100["host_bound"] in ("True", "False")
    for row in rows["sm90"]:  # the columns of a CUDA prediction: its workspaces, and every op modelled here
        assert int(row["workspace_bytes"]) == 65 * 2**20 and row["cuda_unmodeled_ops"] == ""
