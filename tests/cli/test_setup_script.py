"""scripts/setup.sh, the set-up of both README commands: a torch the machine has is kept.

On the H100 the GPU image's python3 held a CUDA build of torch in an environment of its own; set-up made a
plain virtual environment beside it, which does not see that environment's packages (``--system-site-packages``
would show the base interpreter's, not its), and would have installed the CPU build over nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from locations import ROOT


@pytest.mark.slow  # a virtual environment and an editable install (~15 s)
def test_set_up_keeps_the_torch_that_python3_has(tmp_path):
    outer = Path(sys.executable).parent  # this interpreter's environment holds torch: python3 there is the user's
    venv = tmp_path / "venv"
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup.sh"), str(venv), "dev"],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=600,
        env={**os.environ, "PATH": f"{outer}:{os.environ['PATH']}"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "setup: keeping python3's torch" in done.stdout and "installing torch==" not in done.stdout
    probe = (
        "import os, torch, topk_bench, performer_pytorch; "
        "print(os.path.dirname(os.path.dirname(torch.__file__))); print(topk_bench.__file__)"
    )
    found = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, found.stderr
    torch_site, package = found.stdout.split()
    import torch

    assert Path(torch_site) == Path(torch.__file__).parent.parent  # the outer torch, not a second one
    assert Path(package).is_relative_to(ROOT)  # the project, editable
    assert (venv / "bin" / "topk-bench").exists()
