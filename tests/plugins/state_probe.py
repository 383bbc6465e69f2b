"""Test-only implementations: one that corrupts process-wide state on purpose, one that reports that state.

``test_corrupt`` leaves behind what a careless implementation could: a global
torch flag, another default dtype, a thread that never ends, an environment
variable, a module, and memory held by a global. ``test_probe`` writes what it
finds to ``report`` (JSON, once per process), with what it sees of its parent:
the template it was forked from.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import types
from pathlib import Path

import numpy
import torch

from topk_bench import attention
from topk_bench.attention import Implementation

LEAKED_MODULE = "topk_bench_test_leaked_module"
BALLAST: list[torch.Tensor] = []
# What a plug-in drawing random numbers at import gets (before the case seeds torch).
IMPORT_DRAWS = {"torch": torch.rand(4).tolist(), "numpy": numpy.random.rand(4).tolist()}


def _status_kib(pid: int | str, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def corrupt(q, k, v, *, causal=False, activation="softmax", nbytes=128 << 20):
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float64)
    threading.Thread(target=time.sleep, args=(3600,), name="leaked", daemon=False).start()
    os.environ["TOPK_BENCH_TEST_LEAKED"] = "1"
    sys.modules[LEAKED_MODULE] = types.ModuleType(LEAKED_MODULE)
    BALLAST.append(torch.ones(nbytes // 4, dtype=torch.float32))  # touched: resident
    return q.clone()


def probe(q, k, v, *, causal=False, activation="softmax", report=""):
    path = Path(report)
    if report and not path.exists():
        parent = os.getppid()
        state = {
            "pid": os.getpid(),
            "parent_pid": parent,
            "parent_cmdline": Path(f"/proc/{parent}/cmdline").read_bytes().decode().split("\0"),
            "cmdline": Path("/proc/self/cmdline").read_bytes().decode().split("\0"),
            "parent_threads": len(os.listdir(f"/proc/{parent}/task")),
            "parent_rss_kib": _status_kib(parent, "VmRSS"),
            "python_threads": sorted(t.name for t in threading.enumerate()),
            "default_dtype": str(torch.get_default_dtype()),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "leaked_env": os.environ.get("TOPK_BENCH_TEST_LEAKED"),
            "leaked_module": LEAKED_MODULE in sys.modules,
            "ballast": len(BALLAST),
            "cuda_initialized": torch.cuda.is_initialized(),
            "torch_threads": torch.get_num_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "nvml_check": os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"),
            "import_draws": IMPORT_DRAWS,
        }
        path.write_text(json.dumps(state))
    return q.clone()


_IMPLS = [
    Implementation("test_corrupt", corrupt, "changes process-wide state", options={"nbytes": 128 << 20}),
    Implementation("test_probe", probe, "reports process-wide state", options={"report": ""}),
]

for _impl in _IMPLS:
    if _impl.name not in attention.names():
        attention.register(_impl)
