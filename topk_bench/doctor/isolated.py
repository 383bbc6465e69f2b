"""A plug-in implementation's checks in a process of their own: its code may exit, hang or crash; the doctor goes on.

The built-in implementations are checked in the doctor's process. A plug-in's
function is user code: called there, ``os._exit(0)`` or ``sys.exit(0)`` would end
the doctor with exit code 0 and nothing said, and a function that sleeps would hang
it. So its agreement and peak checks run in a fresh interpreter
(``python -m topk_bench.doctor.isolated``: CUDA works there, which a fork of a process
that has used CUDA would not), within :data:`LIMIT_S`; a process that ends without its
checks, or runs past the limit (killed, with whatever it started), fails them, by name, with the last
lines it printed (where it stopped).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from topk_bench.doctor.check import Check, Result

# Interpreter start-up, torch's import and two tiny checks take seconds; minutes on a loaded machine.
LIMIT_S = 180.0
_LOG_TAIL = 300


def checks(names: list[str], device: str, plugins: tuple[str, ...], limit_s: float | None = None) -> list[Check]:
    """The agreement (and, where predictable, peak) checks of each plug-in implementation in ``names``."""
    return [c for name in names for c in _in_child(name, device, plugins, LIMIT_S if limit_s is None else limit_s)]


def _in_child(name: str, device: str, plugins: tuple[str, ...], limit_s: float) -> list[Check]:
    from topk_bench.measure.metadata import PROJECT_ROOT  # the child imports this checkout, as a case's does

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    with tempfile.TemporaryDirectory(prefix="topk-bench-doctor-") as tmp:
        result = Path(tmp) / "checks.json"
        command = [
            sys.executable,
            "-m",
            "topk_bench.doctor.isolated",
            name,
            "--device",
            device,
            "--result",
            str(result),
            *(f"--plugin={p}" for p in plugins),
        ]
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
        try:
            log, _ = proc.communicate(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its process group: whatever it started dies with it
            log, _ = proc.communicate()
            hung = f"did not finish within {limit_s:g} s (killed): does it hang?"
            return [Check(f"agreement: {name}", Result.FAIL, hung + _log_tail(log))]
        if result.exists():
            return [Check(c["name"], Result(c["result"]), c["detail"]) for c in json.loads(result.read_text())]
    code = proc.returncode
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    return [
        Check(
            f"agreement: {name}",
            Result.FAIL,
            f"its process ended ({how}) before the check did: does it call sys.exit or os._exit?" + _log_tail(log),
        )
    ]


def _log_tail(log: bytes) -> str:
    """The last of what the child printed, on one line (where it stopped, when a plug-in says what it does)."""
    tail = " | ".join(line.strip() for line in log.decode(errors="replace").splitlines() if line.strip())
    return f" Log: {tail[-_LOG_TAIL:]}" if tail else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m topk_bench.doctor.isolated", description=__doc__.splitlines()[0])
    parser.add_argument("name", help="the implementation (registered by one of the plug-ins)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--result", type=Path, required=True, help="where the checks go, as JSON")
    parser.add_argument("--plugin", action="append", default=[], help="a module or file to import first")
    args = parser.parse_args(argv)

    import torch

    import topk_bench.attention
    from topk_bench import plugins
    from topk_bench.doctor import agreement, peaks

    torch.set_num_threads(1)  # as the doctor's own process: tiny tensors
    plugins.load(args.plugin)
    found = [agreement.check(args.name, args.device)]
    if topk_bench.attention.spec(args.name).predictable:
        found.extend(peaks.checks_of(args.name, args.device, tuple(args.plugin)))
    partial = args.result.with_suffix(".partial")
    partial.write_text(json.dumps([{**asdict(c), "result": c.result.value} for c in found]))
    os.replace(partial, args.result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
