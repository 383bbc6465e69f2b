import os
import subprocess
import sys

import pytest

from topk_bench import attention


def run_cli(*args):
    # Wide enough that no table wraps a cell (the width is the terminal's, else rich's 80 under TERM).
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "topk_bench", *args], capture_output=True, text=True, env=env)


@pytest.mark.slow
def test_list_shows_every_registered_implementation():
    result = run_cli("list")
    assert result.returncode == 0, result.stderr
    # The doctor's probes register only where the doctor runs (this process may have imported it).
    from topk_bench.doctor.probes import NAMES as DOCTOR_PROBES

    for name in set(attention.names()) - DOCTOR_PROBES:
        assert name in result.stdout
    assert not any(name in result.stdout for name in DOCTOR_PROBES)
    # The model shapes of the inference workloads, and how each implementation takes grouped K/V heads.
    assert "presets" in result.stdout and "q_heads=32, kv_heads=8, head_dim=128" in result.stdout
    assert "grouped K/V" in result.stdout and "native" in result.stdout


@pytest.mark.slow
def test_unknown_command_exits_2_without_traceback():
    result = run_cli("no-such-command")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr


def test_version_is_the_packages_and_needs_no_command():
    from importlib.metadata import version

    result = run_cli("--version")
    assert result.returncode == 0 and result.stdout == f"topk-bench {version('topk-bench')}\n", result
    assert "--version" in run_cli("--help").stdout


def test_gpu_help_names_every_part_of_the_gpu_catalogue():
    """``run --gpu``'s help is the catalogue's parts, the default marked, and the old spellings with what they
    parse as: a part added to the catalogue is in the help without editing it."""
    from topk_bench.predict.kernels.gpus import DEFAULT, GPUS

    text = " ".join(run_cli("run", "--help").stdout.replace("│", " ").split())
    for part in GPUS:
        assert part.value in text
    assert f"{DEFAULT.value} (the default)" in text
    assert "(sm80: a100-80gb, sm90: h100-sxm)" in text
