"""Where a measurement was taken: software versions, device, threads, project revision, host."""

from __future__ import annotations

import functools
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

from topk_bench.types import DeviceKind

# The checkout (or installed tree) holding both packages: topk_bench/measure/metadata.py -> root.
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def cpu_model() -> str:
    """The CPU's marketing name from ``/proc/cpuinfo`` (Linux), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_name(device: str) -> str:
    """GPU model for a CUDA device (when one is visible), CPU model otherwise."""
    import torch  # lazily: a Slurm job's outer process must not pay for torch twice

    if DeviceKind.of(device) is DeviceKind.CUDA and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    if DeviceKind.of(device) is DeviceKind.CUDA:
        return "cuda (not available here)"
    return cpu_model()


@functools.lru_cache(maxsize=1)
def git_sha() -> str:
    """The project's commit, with ``-dirty`` when tracked files differ from it; "" outside a checkout."""
    try:
        sha = subprocess.run(
            ["git", "--no-optional-locks", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=10,
        ).stdout.strip()
        if not sha:
            return ""
        dirty = subprocess.run(
            ["git", "--no-optional-locks", "diff", "--quiet", "HEAD", "--"], cwd=PROJECT_ROOT, capture_output=True, timeout=10,
        ).returncode
        return sha + ("-dirty" if dirty == 1 else "")
    except (OSError, subprocess.SubprocessError):
        return ""


def torch_version() -> str:
    import torch

    return torch.__version__


def collect(device: str = "cpu") -> dict[str, Any]:
    """``Measurement.metadata``: the keys other modules rely on are listed in docs/CONTRACTS.md, "Child and parent"."""
    import torch

    return {
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda or "",
        "device_name": device_name(device),
        "threads": torch.get_num_threads(),
        "hostname": socket.gethostname(),
        "git_sha": git_sha(),
        "python_version": platform.python_version(),
    }
