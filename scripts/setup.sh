#!/usr/bin/env bash
# Set up a virtual environment for topk-bench: VENV (default .venv) is created if missing, with the
# extras EXTRAS (default dev).
#
# torch: a torch that python3 already imports (a CUDA build on a GPU machine, say) is kept: the new
# environment sees python3's site-packages after its own (a .pth file), so nothing installs a second
# torch over it. Where python3 has none, torch==2.13.0 (the CPU build on this kind of machine) is
# installed first, because an unpinned torch pulls a CUDA build of several GB.
#
# Offline (a machine that reaches no package index): PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR, a folder of
# the wheels it lacks (setuptools among them, to build the project).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
EXTRAS="${2:-dev}"
if [ ! -x "$VENV/bin/python" ]; then
    # An interpreter without ensurepip (Debian's python3 without python3-venv, some images) still makes an
    # environment without pip, which python3's own pip then installs into (pip --python).
    python3 -m venv "$VENV" 2>/dev/null || { rm -rf "$VENV"; python3 -m venv --without-pip "$VENV"; }
    # A venv's --system-site-packages would show the base interpreter's packages, not those of the
    # environment python3 runs in (where a GPU image keeps its torch): name that folder instead.
    OUTER=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null || true)
    if [ -n "$OUTER" ]; then
        SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        # As a site directory, so that its own .pth files run too (setuptools' distutils, say).
        echo "import site; site.addsitedir('$OUTER')" >"$SITE/_outer_site.pth"
        echo "setup: keeping python3's torch $(python3 -c 'import torch; print(torch.__version__)') ($OUTER)"
    fi
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip)
"$PY" -m pip --version >/dev/null 2>&1 || PIP=(python3 -m pip --python "$PY")
"${PIP[@]}" install --quiet --upgrade pip >/dev/null 2>&1 || true
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "setup: installing torch==2.13.0"
    "${PIP[@]}" install --quiet "torch==2.13.0"
fi
echo "setup: installing topk-bench[$EXTRAS]"
"${PIP[@]}" install --quiet -e ".[$EXTRAS]"
