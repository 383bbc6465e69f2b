"""Slurm clusters for the tests: the shared one ``$SLURM_CONF`` points to, and a private one for faults.

``slurm_cluster`` uses the cluster ``$SLURM_CONF`` points to when it answers (``.ci/run`` starts one),
else starts one with .ci/slurm/start.sh (installing slurm-wlm and munge if missing, as root). Only
when that fails are the cluster tests skipped, with the script's reason. It is left running for other
sessions; .ci/slurm/stop.sh stops it.

``private_slurm`` starts a second single-node cluster of its own (its own directory, munge and ports) for
the tests that break a node (drain it, set it DOWN): other sessions' jobs on the shared cluster never see
it. It is stopped, and its directory removed, when the module's tests end.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from locations import ROOT

REPO = ROOT
SLURM_DIR = os.environ.get("TOPK_SLURM_DIR", "/tmp/topk-bench-slurm")


def answers(conf: str) -> bool:
    try:
        proc = subprocess.run(
            ["sinfo", "-h", "-o", "%t"],
            capture_output=True,
            text=True,
            timeout=15,
            env={**os.environ, "SLURM_CONF": conf},
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and any(s in proc.stdout for s in ("idle", "mix", "alloc"))


def _start(directory: str, **ports: int) -> str:
    if not sys.platform.startswith("linux"):
        pytest.skip("Slurm cannot start: the test cluster needs Linux")
    env = {**os.environ, **{name: str(port) for name, port in ports.items()}}
    env.pop("SLURM_CONF", None)
    proc = subprocess.run(
        ["bash", str(REPO / ".ci/slurm/start.sh"), directory], capture_output=True, text=True, timeout=900, env=env
    )
    conf = f"{directory}/slurm.conf"
    if proc.returncode != 0 or not answers(conf):
        reason = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"Slurm cannot start on this machine (.ci/slurm/start.sh: {reason})")
    return conf


@pytest.fixture(scope="session")
def slurm_cluster():
    """The slurm.conf of a cluster that answers; started once per session if needed."""
    conf = os.environ.get("SLURM_CONF")
    if conf and answers(conf):
        return conf
    return _start(SLURM_DIR)


@pytest.fixture
def slurm_conf(slurm_cluster, monkeypatch):
    # Only for this test: sbatch/squeue/scancel (run by submitit and the executor) read it.
    monkeypatch.setenv("SLURM_CONF", slurm_cluster)
    return slurm_cluster


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def private_cluster(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("slurm-private"))
    conf = _start(directory, TOPK_SLURMCTLD_PORT=_free_port(), TOPK_SLURMD_PORT=_free_port())
    yield conf
    subprocess.run(["bash", str(REPO / ".ci/slurm/stop.sh"), "--clean", directory], capture_output=True, timeout=120)


@pytest.fixture
def private_slurm(private_cluster, monkeypatch):
    """A cluster of this module's own, its node up at the start of each test."""
    monkeypatch.setenv("SLURM_CONF", private_cluster)
    subprocess.run(["scontrol", "update", "nodename=localhost", "state=resume"], capture_output=True, timeout=60)
    return private_cluster
