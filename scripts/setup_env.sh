#!/usr/bin/env bash
# Create .venv (if missing) and install mathdebate with the given extras, CPU torch first.
# Usage: scripts/setup_env.sh [extras]   e.g. scripts/setup_env.sh train,test
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python_bin="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python_bin" -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
# --no-compile: no bytecode for the whole of torch, transformers and the rest at install time
# (Python writes it on first import, for the modules actually imported): on the 2-core machine
# this install took 101 CPU-s with it and 32 without (docs/testing.md).
if [[ ",$extras," == *",train,"* ]]; then
  # CPU build of torch (a local wheel here; on a GPU box keep the CUDA build you have).
  python -c "import torch" 2>/dev/null || python -m pip install --quiet --no-compile "torch==2.13.0"
fi
spec="."
[ -n "$extras" ] && spec=".[${extras}]"
python -m pip install --quiet --no-compile -e "$spec"
