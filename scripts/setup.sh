#!/usr/bin/env bash
# Set up a virtual environment for topk-bench: VENV (default .venv) is created
# if missing; torch==2.13.0 (the CPU build on this kind of machine) is installed
# first when no torch is importable, because an unpinned torch pulls a CUDA build
# of several GB. A torch that is already there (e.g. a GPU build) is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
EXTRAS="${2:-dev}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
"$PY" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "setup: installing torch==2.13.0"
    "$PY" -m pip install --quiet "torch==2.13.0"
fi
echo "setup: installing topk-bench[$EXTRAS]"
"$PY" -m pip install --quiet -e ".[$EXTRAS]"
